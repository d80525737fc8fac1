//! Scenario tests: events in, verdicts out, through the public API.

use std::path::Path;
use std::sync::OnceLock;

use loopguard_rules::{Config, Policy};
use serde_json::{Value, json};

use crate::{Action, Arguments, Call, Engine, Event, Text, ToolResult, UserMessage, Verdict};

pub(crate) fn default_config() -> Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        Policy::builtin_default()
            .policy
            .unwrap()
            .resolve(None, None)
    })
    .clone()
}

fn config(yaml: &str) -> Config {
    let loaded = Policy::load_text(Path::new("t.yaml"), yaml.to_owned());
    assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
    loaded.policy.unwrap().resolve(None, None)
}

/// Drives one session of an engine with a clock.
struct H {
    engine: Engine,
    session: String,
    t: u64,
    n: u32,
}

impl H {
    fn new(config: Config) -> H {
        H {
            engine: Engine::new(config),
            session: "s".into(),
            t: 1_000,
            n: 0,
        }
    }

    fn default() -> H {
        H::new(default_config())
    }

    fn tick(&mut self) -> u64 {
        self.t += 1_000;
        self.t
    }

    fn call(&mut self, tool: &str, args: Value) -> (Verdict, String) {
        self.n += 1;
        let id = format!("call_{}", self.n);
        let time_ms = self.tick();
        let v = self.engine.observe(&Event::Call(Call {
            session: &self.session,
            call_id: &id,
            tool,
            arguments: Arguments::Json(&args),
            time_ms,
        }));
        (v, id)
    }

    fn result(&mut self, id: &str, output: &str, is_error: bool) -> Verdict {
        let time_ms = self.tick();
        self.engine.observe(&Event::Result(ToolResult {
            session: &self.session,
            call_id: id,
            output,
            is_error,
            exit_code: None,
            time_ms,
        }))
    }

    /// A call and its result; returns both verdicts.
    fn run(&mut self, tool: &str, args: Value, output: &str, is_error: bool) -> (Verdict, Verdict) {
        let (v, id) = self.call(tool, args);
        let r = self.result(&id, output, is_error);
        (v, r)
    }

    fn bash(&mut self, cmd: &str, output: &str, is_error: bool) -> (Verdict, Verdict) {
        self.run("bash", json!({ "command": cmd }), output, is_error)
    }

    fn text(&mut self, text: &str, chunk: bool, end_of_turn: bool) -> Verdict {
        let time_ms = self.tick();
        self.engine.observe(&Event::Text(Text {
            session: &self.session,
            text,
            chunk,
            end_of_turn,
            reasoning: false,
            narration: false,
            time_ms,
        }))
    }

    fn user(&mut self, text: &str, injected: bool) -> Verdict {
        let time_ms = self.tick();
        self.engine.observe(&Event::User(UserMessage {
            session: &self.session,
            text,
            injected,
            time_ms,
        }))
    }

    /// Says each of `turns` without a tool call, each answered by the user message
    /// `reply(n)` (`n` from 1): the turn (from 1) first flagged a monologue.
    fn first_monologue(
        &mut self,
        turns: &[&str],
        reply: impl Fn(usize) -> String,
    ) -> Option<usize> {
        let mut flagged = None;
        for (n, turn) in (1..).zip(turns) {
            let v = self.text(turn, false, false);
            if flagged.is_none() && det(&v) == Some("monologue") {
                flagged = Some(n);
            }
            self.user(&reply(n), false);
        }
        flagged
    }

    fn flags(&self) -> u32 {
        self.engine
            .with_session(&self.session, |s| s.flags())
            .unwrap_or(0)
    }
}

fn det(v: &Verdict) -> Option<&str> {
    v.detector.as_deref()
}

// --- exact_repeat and escalation ----------------------------------------------------------------

#[test]
fn identical_calls_in_one_message_escalate_warn_block_terminate() {
    let mut h = H::default();
    let args = json!({"command": "ls -la"});
    assert!(h.call("bash", args.clone()).0.is_allow());
    assert!(h.call("bash", args.clone()).0.is_allow());
    let (warn, _) = h.call("bash", json!({"command": "ls   -la "}));
    assert_eq!(warn.action, Action::Warn);
    assert_eq!(det(&warn), Some("exact_repeat"));
    assert_eq!(warn.count, 3);
    assert_eq!(
        warn.rule.as_deref(),
        Some("categories.shell/ladders.default[0]")
    );
    assert!(
        warn.message.contains("3 times; latest call: bash"),
        "{}",
        warn.message
    );
    let seqs: Vec<u64> = warn.calls.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(
        warn.loop_start.as_ref().map(|c| c.call_id.as_str()),
        Some("call_1")
    );
    let (block, _) = h.call("bash", args.clone());
    assert_eq!(block.action, Action::Block);
    assert_eq!(
        block.rule.as_deref(),
        Some("categories.shell/ladders.default[2]")
    );
    // The refused call never ran; the loop goes on counting.
    let (stop, _) = h.call("bash", args);
    assert_eq!(stop.action, Action::Terminate);
    assert_eq!(stop.count, 5);
    assert_eq!(h.flags(), 3);
}

#[test]
fn a_long_loop_still_names_the_call_where_it_began() {
    // Warned at the 5th identical call, stopped at the 8th: by then call_1 is older than the
    // session's recent call ids, but the loop's first verdict kept it.
    let yaml = "version: 1\nescalation: { ladder: slow }\nladders:\n  slow:\n    \
        - { repeat: 1, action: warn }\n    - { repeat: 3, action: block }\n    \
        - { repeat: 4, action: terminate }\ndetectors:\n  exact_repeat: { threshold: 5 }\n  \
        fuzzy_repeat: { enabled: false }\n";
    let mut h = H::new(config(yaml));
    let args = json!({"command": "cargo build"});
    let mut verdicts = Vec::new();
    for _ in 0..8 {
        verdicts.push(h.call("bash", args.clone()).0);
    }
    let acted: Vec<(Action, u32)> = verdicts
        .iter()
        .filter(|v| !v.is_allow())
        .map(|v| (v.action, v.count))
        .collect();
    assert_eq!(
        acted,
        [
            (Action::Warn, 5),
            (Action::Warn, 6),
            (Action::Block, 7),
            (Action::Terminate, 8)
        ]
    );
    let stop = verdicts.last().unwrap();
    let start = stop.loop_start.as_ref().unwrap();
    assert_eq!((start.seq, start.call_id.as_str()), (1, "call_1"));
    // Ids in between that nothing pinned are not kept.
    let second = stop.calls.iter().find(|c| c.seq == 2).unwrap();
    assert_eq!(second.call_id, "");

    // The pinned id survives a snapshot.
    let snap = h.engine.snapshot_session("s").unwrap();
    let restored = Engine::new(config(yaml));
    restored.restore_session("s", &snap).unwrap();
    assert_eq!(restored.snapshot_session("s").unwrap(), snap);
    let again = restored.observe(&Event::Call(Call {
        session: "s",
        call_id: "call_9",
        tool: "bash",
        arguments: Arguments::Json(&args),
        time_ms: 1_000_000,
    }));
    let start = again.loop_start.unwrap();
    assert_eq!((start.seq, start.call_id.as_str()), (1, "call_1"));
}

#[test]
fn exact_repeat_and_no_progress_share_one_counter() {
    let mut h = H::default();
    h.bash("ls", "a b c", false);
    h.bash("ls", "a b c", false);
    let (call, result) = h.bash("ls", "a b c", false);
    assert_eq!(call.action, Action::Warn);
    // no_progress sees the same loop on the same call: not escalated twice.
    assert!(result.is_allow(), "{result:?}");
    let (call, _) = h.bash("ls", "a b c", false);
    assert_eq!(call.action, Action::Block);
}

#[test]
fn chance_then_break_lets_a_different_call_pass() {
    let mut h = H::new(config(
        "version: 1\nescalation: { ladder: chance_then_break }\n",
    ));
    let args = json!({"query": "weather"});
    h.run("search", args.clone(), "sunny", false);
    h.run("search", args.clone(), "sunny", false);
    let (warn, id) = h.call("search", args.clone());
    assert_eq!(warn.action, Action::Warn);
    h.result(&id, "sunny", false);
    let (other, id) = h.call("search", json!({"query": "news"}));
    assert!(other.is_allow());
    h.result(&id, "headlines", false);
    let (again, _) = h.call("search", args);
    assert_eq!(again.action, Action::Block);
    assert_eq!(again.rule.as_deref(), Some("ladders.chance_then_break[1]"));
}

#[test]
fn polling_with_changing_output_is_progress() {
    let mut h = H::default();
    for i in 0..12 {
        let (c, r) = h.run(
            "check_job",
            json!({"job": "build-7"}),
            &format!("running: {} of 12 steps", i),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "poll {i}: {c:?} {r:?}");
    }
}

/// A long status report with one word that is the news.
fn long_report(state: &str) -> String {
    format!(
        "Deployment report for service checkout-api in region eu-west-1. The rollout controller \
         watches every replica, drains connections before restarting a pod, and reports the \
         state of the whole deployment once per poll. Replicas are healthy, the load balancer \
         routes traffic to the new version, and alarms are quiet. Current state: {state}."
    )
}

#[test]
fn near_duplicate_successes_are_still_progress() {
    let mut h = H::default();
    let states = [
        "pending",
        "rolling",
        "verifying",
        "draining",
        "settling",
        "done",
    ];
    for (i, state) in states.iter().enumerate() {
        let (c, r) = h.run(
            "deploy_status",
            json!({"service": "checkout-api"}),
            &long_report(state),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "poll {i}: {c:?} {r:?}");
    }
}

/// A long error page that echoes what was asked in its first line.
fn error_page(slug: &str) -> String {
    format!(
        "Error: GET /api/products/{slug}/reviews failed\n\
         Traceback (most recent call last):\n\
         File \"/srv/shop/reviews/views.py\", line 41, in list_reviews\n\
         qs = Review.objects.filter(product__slug=slug).select_related(\"author\")\n\
         File \"/srv/shop/.venv/lib/python3.11/site-packages/django/db/models/query.py\", line 1436, in filter\n\
         return self._filter_or_exclude(False, args, kwargs)\n\
         django.db.utils.ProgrammingError: relation \"reviews_review_author\" does not exist\n\
         LINE 1: SELECT review.rating, reviews_review_author.display_name FROM reviews_review\n\
         Please report this incident to the shop platform team."
    )
}

/// A linter's rejection of a proposed edit: a fixed header and footer around the error it
/// found and the proposal echoed back whole.
fn lint_rejection(error: &str, proposal: &str) -> String {
    let echoed: String = proposal
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{}:{l}\n", i + 1))
        .collect();
    format!(
        "Your proposed edit has introduced new syntax error(s). Please read this error message \
         carefully and then retry editing the file.\nERRORS:\n- {error}\nThis is how your edit \
         would have looked if applied\n-----\n{echoed}-----\nThis is the original code before \
         your edit\n-----\n1:\n-----\nYour changes have NOT been applied. Please fix your edit \
         command and try again.\nDO NOT re-run the same failed edit command."
    )
}

/// The proposal an agent revises between lint rejections.
const PROPOSAL: &str = "def words(constant, min_length):\n    processed = []\n    raw = []\n    \
    for word in re.findall(r'[a-z]+', constant):\n        word = word.strip()\n        if \
    len(word) >= min_length and not word.startswith('-'):\n            if is_camel(word):\n                \
    raw.append(word)\n            else:\n                processed.append(word.lower())\n    \
    return processed, raw\nprint(complexity(words))";

#[test]
fn near_duplicate_rejections_naming_other_errors_are_different_outcomes() {
    // Each revision fixes what the linter named and the next report names something else; the
    // rest of each page (the header, the footer, the proposal echoed back) is nearly the same.
    let mut h = H::default();
    for (i, error) in [
        "E999 SyntaxError: '(' was never closed",
        "F821 undefined name 're'",
        "F821 undefined name 'is_camel'",
        "E999 IndentationError: unexpected indent",
    ]
    .iter()
    .enumerate()
    {
        let proposal = format!(
            "{PROPOSAL}\n# revision {}",
            ["one", "two", "three", "four"][i]
        );
        let (c, r) = h.bash(
            &format!("edit 1:1\n{proposal}\nend_of_edit"),
            &lint_rejection(error, &proposal),
            true,
        );
        assert!(c.is_allow() && r.is_allow(), "revision {i}: {c:?} {r:?}");
    }
    // The same error each time is one outcome, however the proposal changed.
    let mut h = H::default();
    let mut flagged = None;
    for (i, word) in ["one", "two", "three"].iter().enumerate() {
        let proposal = format!("{PROPOSAL}\n# revision {word}");
        let (_, r) = h.bash(
            &format!("edit 1:1\n{proposal}\nend_of_edit"),
            &lint_rejection("E999 SyntaxError: '(' was never closed", &proposal),
            true,
        );
        if flagged.is_none() && !r.is_allow() {
            flagged = Some((i + 1, det(&r).map(str::to_owned)));
        }
    }
    assert_eq!(flagged, Some((3, Some("same_outcome".to_owned()))));
}

/// Version 1 sketched failures without their named error line: restored, such a failure
/// keeps its digest but no sketch, and the snapshot written back is the current version.
#[test]
fn a_version_1_snapshot_drops_the_sketches_of_its_failures() {
    let mut h = H::default();
    let (_, _) = h.bash(
        "edit 1:1",
        &lint_rejection("F821 undefined name 're'", PROPOSAL),
        true,
    );
    let (_, _) = h.bash("cat notes.txt", &PROPOSAL.repeat(2), false);
    let snap = h.engine.snapshot_session("s").unwrap();
    assert_eq!(snap["version"], 3);
    let flags = |s: &Value| -> Vec<u64> {
        s["window"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["flags"].as_u64().unwrap())
            .collect()
    };
    let sketched = |f: u64| f & u64::from(crate::detect::flag::SKETCH) != 0;
    assert!(flags(&snap).into_iter().all(sketched), "{snap}");
    let mut old = snap.clone();
    old["version"] = json!(1);
    let restored = Engine::new(default_config());
    restored.restore_session("s", &old).unwrap();
    let back = restored.snapshot_session("s").unwrap();
    assert_eq!(back["version"], 3);
    let kept: Vec<bool> = flags(&back).into_iter().map(sketched).collect();
    assert_eq!(
        kept,
        [false, true],
        "the failure's sketch dropped, the success's kept"
    );
    let digests = |s: &Value| {
        s["window"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["digest"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(digests(&back), digests(&snap));
    // The same through a whole-engine snapshot.
    let mut whole = h.engine.snapshot();
    whole["version"] = json!(1);
    let restored = Engine::new(default_config());
    restored.restore(&whole).unwrap();
    let back = restored.snapshot_session("s").unwrap();
    assert_eq!(
        flags(&back).into_iter().map(sketched).collect::<Vec<_>>(),
        [false, true]
    );
}

/// Version 2 knew a failure ending with an exception by its first and last lines: restored,
/// such a failure keeps its digest and its sketch, and the snapshot written back is version 3.
#[test]
fn a_version_2_snapshot_keeps_its_failures() {
    let mut h = H::default();
    let trace =
        "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: bad";
    let (_, _) = h.bash("python t.py", trace, true);
    let (_, _) = h.bash("cat notes.txt", &PROPOSAL.repeat(2), false);
    let snap = h.engine.snapshot_session("s").unwrap();
    let mut old = snap.clone();
    old["version"] = json!(2);
    let restored = Engine::new(default_config());
    restored.restore_session("s", &old).unwrap();
    let back = restored.snapshot_session("s").unwrap();
    assert_eq!(back["version"], 3);
    assert_eq!(back["window"], snap["window"]);
    old["version"] = json!(4);
    assert!(matches!(
        Engine::new(default_config()).restore_session("s", &old),
        Err(crate::SnapshotError::Version(_))
    ));
}

#[test]
fn near_duplicate_failures_of_different_calls_are_one_outcome() {
    let mut h = H::default();
    let slugs = ["alpine-jacket", "merino-layer", "summit-gaiters"];
    let mut last = None;
    for slug in slugs {
        let url = format!("https://shop.example.com/api/products/{slug}/reviews");
        let (_, r) = h.run("http_get", json!({ "url": url }), &error_page(slug), true);
        last = Some(r);
    }
    let r = last.unwrap();
    assert_eq!(det(&r), Some("same_outcome"), "{r:?}");

    // Failures that only share their frame are different failures.
    let mut h = H::default();
    for (i, exc) in [
        "AttributeError: 'Settings' object has no attribute 'OPEN_STATES' while building the open orders widget",
        "TypeError: int() argument must be a string or a real number, not 'NoneType' in low_stock view",
        "ImportError: Unable to find a usable engine; tried using: 'pyarrow', 'fastparquet' for the cohort cache",
    ]
    .iter()
    .enumerate()
    {
        let out = format!(
            "Error: GET /api/widgets/{i} failed\nTraceback (most recent call last):\n{exc}\nPlease report this incident to the shop platform team."
        );
        let (_, r) = h.run("http_get", json!({ "url": format!("/api/widgets/{i}") }), &out, true);
        assert!(r.is_allow(), "failure {i}: {r:?}");
    }
}

#[test]
fn polling_with_masked_noise_is_no_progress() {
    let mut h = H::new(config(
        "version: 1\ndetectors: { exact_repeat: { threshold: 10 } }\n",
    ));
    let out = |i: u32| {
        format!(
            "status: degraded (message id 123e4567-e89b-12d3-a456-42661417400{i}) pid {} at 2024-01-0{i}T10:00:00Z, read {i} times",
            1000 + i
        )
    };
    assert!(h.run("status", json!({}), &out(1), false).1.is_allow());
    assert!(h.run("status", json!({}), &out(2), false).1.is_allow());
    let (_, r) = h.run("status", json!({}), &out(3), false);
    assert_eq!(det(&r), Some("no_progress"));
    assert_eq!(r.action, Action::Warn);
}

#[test]
fn paging_with_different_offsets_is_not_a_loop() {
    let mut h = H::default();
    for i in 0..15 {
        let (c, r) = h.run(
            "read_file",
            json!({"path": "big.log", "offset": i * 100, "limit": 100}),
            &format!("lines {}..{}", i * 100, i * 100 + 100),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "page {i}");
    }
}

#[test]
fn same_edit_to_ten_files_is_not_a_loop() {
    let mut h = H::default();
    for i in 0..10 {
        let (c, r) = h.run(
            "edit_file",
            json!({"path": format!("src/m{i}.rs"), "old_string": "foo()", "new_string": "bar()"}),
            &format!("Edited src/m{i}.rs"),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "edit {i}: {c:?} {r:?}");
    }
}

#[test]
fn retries_of_rate_limited_calls_are_not_loops() {
    let mut h = H::default();
    for _ in 0..8 {
        let (c, r) = h.run(
            "web_fetch",
            json!({"url": "https://x.test"}),
            "HTTP 429 Too Many Requests",
            true,
        );
        assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
    }
    // And a success after the retries is fine too.
    assert!(
        h.run("web_fetch", json!({"url": "https://x.test"}), "ok", false)
            .0
            .is_allow()
    );
}

/// Retrying through a rate limit is what the error asks for, but not without end: the same
/// call refused so again and again is flagged at `RETRY_SLACK` times its threshold.
#[test]
fn retries_of_a_rate_limited_call_without_end_are_a_loop() {
    let mut h = H::default();
    // `web_fetch` is an exploration tool: `exact_repeat` threshold 4.
    let limit = 4 * crate::detect::RETRY_SLACK as usize;
    for i in 1..limit {
        let (c, r) = h.run(
            "web_fetch",
            json!({"url": "https://x.test"}),
            "HTTP 429 Too Many Requests",
            true,
        );
        assert!(c.is_allow() && r.is_allow(), "retry {i}: {c:?} {r:?}");
    }
    let (c, _) = h.run(
        "web_fetch",
        json!({"url": "https://x.test"}),
        "HTTP 429 Too Many Requests",
        true,
    );
    assert_eq!(c.action, Action::Warn, "{c:?}");
    assert_eq!(c.detector.as_deref(), Some("exact_repeat"));
    assert_eq!(c.count, limit as u32);
}

/// A failing test run reports on the code under test: a 503 its test met is the code's
/// failure, and the same run failing so again is a loop like any other.
#[test]
fn a_test_run_failing_on_a_service_unavailable_status_is_no_retry() {
    let mut h = H::default();
    let out = "E   assert 503 == 200\nE    +  where 503 = <Response streamed [503 SERVICE UNAVAILABLE]>.status_code\nFAILED tests/test_health.py::test_ok\n1 failed in 0.21s";
    let (c1, _) = h.bash("pytest tests/test_health.py", out, true);
    let (c2, _) = h.bash("pytest tests/test_health.py", out, true);
    let (c3, _) = h.bash("pytest tests/test_health.py", out, true);
    assert!(c1.is_allow() && c2.is_allow(), "{c1:?} {c2:?}");
    assert_eq!(c3.action, Action::Warn, "{c3:?}");
    // The same output from a command that runs no tests is the infrastructure's trouble.
    let mut h = H::default();
    for _ in 0..6 {
        let (c, r) = h.bash("curl -sf https://api.example.com/health", out, true);
        assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
    }
}

#[test]
fn user_asking_for_repeats_grants_an_allowance() {
    let mut h = H::default();
    h.user("please run the benchmark 5 times", false);
    for i in 0..7 {
        let (c, _) = h.bash("./bench.sh", "median 12.5ms", false);
        assert!(c.is_allow(), "run {i}: {c:?}");
    }
    // threshold 3 + 5 extra: the 8th identical run is flagged.
    assert_eq!(
        h.bash("./bench.sh", "median 12.5ms", false).0.action,
        Action::Warn
    );
    // The allowance ends with the next user message.
    h.user("thanks, now check git status", false);
    h.bash("git status", "clean", false);
    h.bash("git status", "clean", false);
    assert_eq!(h.bash("git status", "clean", false).0.action, Action::Warn);
}

#[test]
fn allowance_words_and_intervals() {
    let c = default_config();
    assert_eq!(crate::session::allowance(&c.user, "run it 5 times"), 5);
    assert_eq!(crate::session::allowance(&c.user, "try it three times"), 3);
    assert_eq!(
        crate::session::allowance(&c.user, "keep polling every 5 seconds"),
        10
    );
    assert_eq!(crate::session::allowance(&c.user, "fix the bug"), 0);
}

/// The user patterns read a whole message, however long (megabytes of non-ASCII text took
/// seconds); they read its first and last 4 KiB, where a person's request stands.
#[test]
fn user_patterns_read_only_the_ends_of_a_long_message() {
    let c = default_config();
    let pasted = "é log line\n".repeat(1000);
    for (text, n) in [
        (format!("run it 5 times\n{pasted}"), 5),
        (format!("{pasted}\nrun it 5 times"), 5),
        (format!("{pasted}\nrun it 5 times\n{pasted}"), 0),
    ] {
        assert_eq!(crate::session::allowance(&c.user, &text), n);
    }
}

#[test]
fn a_request_not_to_repeat_grants_no_allowance() {
    let c = default_config();
    for text in [
        "try again, do not ReadFile office-details.component.html again and again",
        "please don't repeat this over and over",
        "you keep reading it again and again!",
        "don't keep polling",
        "Stop running the tests repeatedly.",
        "why do you keep retrying",
    ] {
        assert_eq!(crate::session::allowance(&c.user, text), 0, "{text}");
    }
    for (text, n) in [
        ("keep polling until it finishes", 10),
        ("can you keep polling every 5 seconds?", 10),
        ("No, run it 4 times", 4),
        ("don't stop early, run the benchmark 5 times", 5),
        ("don't forget to run the benchmark 3 times", 3),
    ] {
        assert_eq!(crate::session::allowance(&c.user, text), n, "{text}");
    }
}

/// A test re-run after each edit made by a tool no category lists (a harness's own
/// `apply_edit`) was the same failing call again and again: its search-and-replace arguments
/// are an edit, whatever the tool is named, so a successful one between two runs is progress;
/// one that failed changed nothing.
#[test]
fn an_edit_by_an_unlisted_tool_is_progress_between_test_runs() {
    let first_flag = |edit_fails: bool| {
        let mut h = H::default();
        (1..=6).find(|i| {
            let edit = json!({
                "path": "src/seed.ts",
                "search": format!("const n = {i};"),
                "replace": format!("const n = {};", i + 1),
            });
            let (e, _) = h.run(
                "apply_edit",
                edit,
                if edit_fails {
                    "Error: search text not found in src/seed.ts"
                } else {
                    "Applied edit to src/seed.ts"
                },
                edit_fails,
            );
            // The failure moves with each edit (the same one again would be `test_fix`).
            let failure = [
                "SyntaxError: Unexpected token ] in JSON",
                "MongoBulkWriteError: E11000 duplicate key error",
                "AssertionError: expected 4 to be 2",
                "ReferenceError: usersCollection is not defined",
                "ReferenceError: beforeEach is not defined",
                "TypeError: client.close is not a function",
            ][*i - 1];
            let (c, r) = h.bash(
                "vitest run",
                &format!("FAIL tests/seed.test.ts\n{failure}"),
                true,
            );
            !(e.is_allow() && c.is_allow() && r.is_allow())
        })
    };
    assert_eq!(first_flag(false), None);
    assert!(first_flag(true).is_some());
}

/// The same edit sent again after it was applied fails (its old text is gone): that failure
/// is no change from the success before it, so the third identical edit is flagged, as the
/// third identical write is. After another write to the file, the same edit is a new attempt.
#[test]
fn an_edit_made_again_after_it_succeeded_is_no_change() {
    let edit = json!({"path": "AGENTS.md", "old_text": "## Rules", "new_text": "## Rules\n- no force pushes"});
    let mut h = H::default();
    let verdicts: Vec<Action> = [
        "Edited AGENTS.md",
        "The text to replace was not found",
        "The text to replace was not found",
    ]
    .iter()
    .map(|out| {
        let (c, r) = h.run("edit_file", edit.clone(), out, false);
        c.action.max(r.action)
    })
    .collect();
    assert_eq!(verdicts, [Action::Allow, Action::Allow, Action::Warn]);
    // Another write between: the file changed, and the same edit succeeding then failing is
    // news of it.
    let mut h = H::default();
    h.run("edit_file", edit.clone(), "Edited AGENTS.md", false);
    h.run(
        "write_file",
        json!({"path": "AGENTS.md", "content": "## Rules\n"}),
        "Wrote AGENTS.md",
        false,
    );
    let (c, r) = h.run("edit_file", edit.clone(), "Edited AGENTS.md", false);
    assert!(c.is_allow() && r.is_allow());
    let (c, r) = h.run(
        "edit_file",
        edit,
        "The text to replace was not found",
        false,
    );
    assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
}

#[test]
fn a_user_forbidding_repeats_does_not_lift_the_count() {
    let mut h = H::default();
    h.user(
        "try again, do not read office-details.component.html again and again",
        false,
    );
    let read = json!({"path": "src/app/office-details.component.html"});
    // Flagged at the third read (on its call or its result), refused at the fourth.
    let verdicts: Vec<Action> = (0..4)
        .map(|_| {
            let (c, r) = h.run("read_file", read.clone(), "<div>office</div>", false);
            c.action.max(r.action)
        })
        .collect();
    assert_eq!(
        verdicts,
        [Action::Allow, Action::Allow, Action::Warn, Action::Block]
    );
    // A refusal to retry is no retry either.
    let mut h = H::default();
    for _ in 0..2 {
        h.bash("npm test", "1 failing", true);
    }
    h.user("don't re-run the tests, read the failure first", false);
    let (c, r) = h.bash("npm test", "1 failing", true);
    assert_eq!(c.action.max(r.action), Action::Warn, "{c:?} {r:?}");
}

// --- fuzzy, cycle, interleaved --------------------------------------------------------------------

#[test]
fn reading_one_file_many_ways_is_a_fuzzy_repeat() {
    let mut h = H::default();
    let file = "fn main() {}";
    assert!(h.bash("cat src/main.rs", file, false).0.is_allow());
    assert!(h.bash("head -n 20 src/main.rs", file, false).0.is_allow());
    assert!(h.bash("tail src/main.rs", file, false).0.is_allow());
    let (c, _) = h.bash("head -5 ./src/main.rs", file, false);
    assert_eq!(det(&c), Some("fuzzy_repeat"), "{c:?}");
}

#[test]
fn a_b_a_b_is_confirmed_as_a_cycle_at_the_fifth_call() {
    let mut h = H::default();
    let a = json!({"path": "a.rs"});
    let b = json!({"pattern": "todo"});
    assert!(h.run("read_file", a.clone(), "A", false).0.is_allow());
    assert!(h.run("grep", b.clone(), "B", false).0.is_allow());
    assert!(h.run("read_file", a.clone(), "A", false).0.is_allow());
    // A pair of steps done twice is not yet a loop.
    assert!(h.run("grep", b, "B", false).0.is_allow());
    let (c, _) = h.run("read_file", a, "A", false);
    assert_eq!(det(&c), Some("cycle"));
    assert_eq!(c.calls.len(), 5);

    // Without `confirm` (strict), the fourth call already closes the cycle.
    let mut h = H::new(config(
        "version: 1\ndetectors: { cycle: { confirm: false } }\n",
    ));
    let a = json!({"path": "a.rs"});
    let b = json!({"pattern": "todo"});
    assert!(h.run("read_file", a.clone(), "A", false).0.is_allow());
    assert!(h.run("grep", b.clone(), "B", false).0.is_allow());
    assert!(h.run("read_file", a, "A", false).0.is_allow());
    assert_eq!(det(&h.run("grep", b, "B", false).0), Some("cycle"));
}

#[test]
fn a_cycle_whose_results_change_is_progress() {
    let mut h = H::default();
    for i in 0..3 {
        let (c1, _) = h.run(
            "read_file",
            json!({"path": "log.txt"}),
            &format!("line {i}"),
            false,
        );
        let (c2, _) = h.bash("make", &format!("step {i} done"), false);
        assert!(c1.is_allow() && c2.is_allow(), "{i}: {c1:?} {c2:?}");
    }
}

#[test]
fn a_failing_test_rerun_between_reads_is_interleaved() {
    let mut h = H::new(config(
        "version: 1\ndetectors: { exact_repeat: { threshold: 10 } }\n",
    ));
    let fail = "FAILED tests/test_x.py::test_a - AssertionError";
    assert!(h.bash("pytest", fail, true).0.is_allow());
    h.run("read_file", json!({"path": "a.py"}), "a", false);
    assert!(h.bash("pytest", fail, true).0.is_allow());
    h.run("read_file", json!({"path": "b.py"}), "b", false);
    let (c, _) = h.bash("pytest", fail, true);
    assert_eq!(det(&c), Some("interleaved"), "{c:?}");
}

#[test]
fn test_reruns_after_real_edits_then_passing_are_fine() {
    let mut h = H::default();
    for (i, out) in [
        "3 failed, 7 passed",
        "2 failed, 8 passed",
        "1 failed, 9 passed",
    ]
    .iter()
    .enumerate()
    {
        let (c, r) = h.run(
            "edit_file",
            json!({"path": format!("f{i}.py"), "old_string": "a", "new_string": "b"}),
            "ok",
            false,
        );
        assert!(c.is_allow() && r.is_allow());
        let (c, r) = h.bash("pytest -q", out, true);
        assert!(c.is_allow() && r.is_allow(), "run {i}: {c:?} {r:?}");
    }
    let (c, r) = h.bash("pytest -q", "10 passed", false);
    assert!(c.is_allow() && r.is_allow());
}

#[test]
fn five_failing_test_runs_are_a_test_fix_loop() {
    let mut h = H::default();
    let mut last = Verdict::allow();
    for i in 0..5 {
        h.run(
            "edit_file",
            json!({"path": format!("f{i}.py"), "old_string": "a", "new_string": "b"}),
            "ok",
            false,
        );
        last = h
            .bash("cargo test", "test parse ... FAILED\n1 failed", true)
            .1;
        if i < 4 {
            assert!(last.is_allow(), "{i}: {last:?}");
        }
    }
    assert_eq!(det(&last), Some("test_fix"));
    // A passing run resets.
    h.bash("cargo test", "ok", false);
    assert!(h.bash("cargo test", "1 failed", true).1.is_allow());
}

/// A harness's own test tool (`run_tests`, no shell command) reporting `6/8 tests passed` and
/// the same `FAIL:` lines was neither a test run nor a failure: every edit between its runs
/// restarted the count, and the loop went unflagged.
#[test]
fn a_test_tool_failing_the_same_way_between_edits_is_a_test_fix_loop() {
    let mut h = H::default();
    let out = "6/8 tests passed\nFAIL: week_one: got 2026-01-08, expected 2025-12-29\nFAIL: last_week: got 2027-01-08, expected 2027-01-03";
    let mut last = Verdict::allow();
    for i in 0..5 {
        h.run(
            "replace_in_file",
            json!({"path": "parse.py", "old": format!("a{i}"), "new": format!("a{}", i + 1)}),
            "replaced 1 occurrence in parse.py",
            false,
        );
        last = h.run("run_tests", json!({}), out, false).1;
        if i < 4 {
            assert!(last.is_allow(), "{i}: {last:?}");
        }
    }
    assert_eq!(det(&last), Some("test_fix"));
    // The same tool passing is no failure.
    assert!(
        h.run("run_tests", json!({}), "8/8 tests passed", false)
            .1
            .is_allow()
    );
}

/// An edit that puts back the very text it replaces (`old_str` equal to `new_str`) counted as
/// progress, and the identical failing runs around it were never counted together.
#[test]
fn an_edit_replacing_a_text_with_itself_is_no_progress() {
    let run = |noop: bool| {
        let mut h = H::default();
        let mut flagged = None;
        for (i, line) in ["import a", "def f(x):", "    return x", "import b"]
            .iter()
            .enumerate()
        {
            let new = if noop {
                (*line).to_owned()
            } else {
                format!("{line}  # {i}")
            };
            h.run(
                "str_replace_based_edit_tool",
                json!({"command": "str_replace", "path": "/r/m.py", "old_str": line, "new_str": new}),
                "The file /r/m.py has been edited.",
                false,
            );
            let (c, r) = h.bash(
                "pytest -q",
                "E   AssertionError: assert 1999 == 2000\n1 failed",
                true,
            );
            if flagged.is_none() && (!c.is_allow() || !r.is_allow()) {
                flagged = Some(i);
            }
        }
        flagged
    };
    assert_eq!(run(false), None, "real edits between the runs are progress");
    assert!(
        run(true).is_some(),
        "edits that change nothing are no progress"
    );
}

/// A write made again with no other write since (the same `git diff > fix.patch`, the same
/// file written with the same text) left the world as the first one did, yet counted as
/// progress each time.
#[test]
fn a_write_made_again_with_no_other_write_since_is_no_progress() {
    let mut h = H::default();
    let write = json!({"path": "notes.md", "content": "the same text"});
    let check = "check failed: notes.md lacks a title";
    h.bash("make check", check, true);
    let mut flagged = false;
    // A different look after each write: no cycle, only `make check` repeats.
    for look in ["cat notes.md", "ls", "wc -l notes.md"] {
        let (w, _) = h.run("write_file", write.clone(), "wrote notes.md", false);
        assert!(
            w.is_allow(),
            "the write itself is not repeated often enough: {w:?}"
        );
        let (c, r) = h.bash(look, "notes.md", false);
        assert!(c.is_allow() && r.is_allow(), "{look}: {c:?} {r:?}");
        let (c, r) = h.bash("make check", check, true);
        flagged |= !c.is_allow() || !r.is_allow();
    }
    assert!(flagged, "the same write again is no progress");
    // A different write between two identical ones is: the second restores what it changed.
    let mut h = H::default();
    for i in 0..4 {
        let content = if i % 2 == 0 {
            "one text"
        } else {
            "another text"
        };
        h.run(
            "write_file",
            json!({"path": "notes.md", "content": content}),
            "wrote notes.md",
            false,
        );
        let (c, r) = h.bash("make check", &format!("check failed: {i} problems"), true);
        assert!(c.is_allow() && r.is_allow(), "{i}: {c:?} {r:?}");
    }
}

/// A shell command writing a file with the content it already holds changes nothing, even
/// with other work between the two writes: re-running the same failing program after it is a
/// repeat. A write of other content, or a command that may have changed the file since
/// (`sed -i`), makes the same write a change again.
#[test]
fn a_file_written_again_with_the_content_it_holds_is_no_progress() {
    let write = "echo \"print(undefined_name)\" > app.py";
    let run = "python app.py";
    let failure = "NameError: name 'undefined_name' is not defined";
    let rewrite_then_run = |between: &[&str], second: &str| {
        let mut h = H::default();
        h.bash(write, "", false);
        for cmd in between {
            h.bash(cmd, "", false);
        }
        h.bash(run, failure, true);
        let mut flagged = false;
        for look in ["ls", "cat app.py"] {
            let (w, _) = h.bash(second, "", false);
            flagged |= !w.is_allow();
            let (c, r) = h.bash(look, "app.py", false);
            flagged |= !c.is_allow() || !r.is_allow();
            let (c, r) = h.bash(run, failure, true);
            flagged |= !c.is_allow() || !r.is_allow();
        }
        flagged
    };
    assert!(
        rewrite_then_run(&["pip install flask", "mkdir -p logs"], write),
        "the same content again is no progress"
    );
    assert!(
        !rewrite_then_run(&["pip install flask"], "echo \"print(1)\" > app.py"),
        "other content is a change"
    );
    assert!(
        !rewrite_then_run(&["sed -i s/undefined_name/x/ app.py"], write),
        "after a change not followed, the same write may restore the file"
    );
}

/// An editing tool writing two files in turn with the same contents each round changes
/// nothing after the first round: the same failing check between rounds is a repeat. When
/// one of the files gets new content each round, every round is progress.
#[test]
fn files_written_in_turn_with_the_contents_they_hold_are_no_progress() {
    let rounds = |second: &dyn Fn(usize) -> String| {
        let mut h = H::default();
        let mut flagged = false;
        for (i, look) in ["ls", "cat app.py", "wc -l app.py"].into_iter().enumerate() {
            let steps = [
                (
                    "write_file",
                    json!({"path": "app.py", "content": "import cfg"}),
                ),
                (
                    "write_file",
                    json!({"path": "cfg.py", "content": second(i)}),
                ),
            ];
            for (tool, args) in steps {
                let (c, r) = h.run(tool, args, "wrote", false);
                flagged |= !c.is_allow() || !r.is_allow();
            }
            let (c, r) = h.bash(look, "app.py cfg.py", false);
            flagged |= !c.is_allow() || !r.is_allow();
            let (c, r) = h.bash(
                "python app.py",
                "ImportError: cannot import name 'PORT'",
                true,
            );
            flagged |= !c.is_allow() || !r.is_allow();
        }
        flagged
    };
    assert!(
        rounds(&|_| "HOST = 1".to_owned()),
        "the same two writes again are no progress"
    );
    assert!(
        !rounds(&|i| format!("HOST = {i}")),
        "a new content each round is progress"
    );
}

/// Failing test runs whose failure changes between edits (fewer tests failing) are progress.
#[test]
fn test_runs_failing_differently_after_edits_are_progress() {
    let mut h = H::default();
    for i in 0..8 {
        h.run(
            "edit_file",
            json!({"path": format!("f{i}.py"), "old_string": "a", "new_string": "b"}),
            "ok",
            false,
        );
        let (c, r) = h.bash("cargo test", &format!("{} failed", 9 - i), true);
        assert!(c.is_allow() && r.is_allow(), "{i}: {c:?} {r:?}");
    }
}

// --- results ------------------------------------------------------------------------------------

#[test]
fn different_searches_with_nothing_found_are_same_outcome_at_the_empty_threshold() {
    let mut h = H::default();
    // Searching for what is not there takes a few spellings: the default empty threshold is 5.
    for pattern in [
        "retry_budget",
        "retryBudget",
        "RETRY_BUDGET",
        "retry-budget",
    ] {
        let (_, r) = h.run(
            "grep",
            json!({ "pattern": pattern }),
            "No matches found",
            false,
        );
        assert!(r.is_allow(), "{pattern}: {r:?}");
    }
    let r = h
        .run(
            "grep",
            json!({"pattern": "retrybudget"}),
            "No matches found",
            false,
        )
        .1;
    assert_eq!(det(&r), Some("same_outcome"), "{r:?}");
    assert_eq!(r.count, 5);

    // The threshold is the policy's.
    let mut h = H::new(config(
        "version: 1\ndetectors: { same_outcome: { empty_threshold: 3 } }\n",
    ));
    for (i, pattern) in ["foo", "bar", "baz"].into_iter().enumerate() {
        let (_, r) = h.run(
            "grep",
            json!({ "pattern": pattern }),
            "No matches found",
            false,
        );
        assert_eq!(r.is_allow(), i < 2, "{pattern}: {r:?}");
    }
}

#[test]
fn calls_of_one_message_are_one_try_for_same_outcome_and_error_cascade() {
    // Five reads in one assistant message: the model made them all before it saw any result.
    let mut h = H::default();
    for batch in 0..2 {
        let ids: Vec<String> = (0..5)
            .map(|i| {
                let path = format!("pkg{batch}/m{i}/__init__.py");
                h.call("read_file", json!({ "path": path })).1
            })
            .collect();
        for id in &ids {
            let r = h.result(id, "", false);
            assert!(r.is_allow(), "batch {batch}: {r:?}");
        }
    }
    let ids: Vec<String> = (0..5)
        .map(|i| {
            h.call("read_file", json!({ "path": format!("gone/{i}.py") }))
                .1
        })
        .collect();
    for id in &ids {
        let r = h.result(id, "ENOENT: no such file or directory", true);
        assert!(r.is_allow(), "{r:?}");
    }
    // The same reads one after another, each seen before the next: a run of tries.
    let mut h = H::default();
    let mut verdicts = Vec::new();
    for i in 0..5 {
        let path = format!("pkg/m{i}/__init__.py");
        verdicts.push(h.run("read_file", json!({ "path": path }), "", false).1);
    }
    assert_eq!(det(&verdicts[4]), Some("same_outcome"), "{verdicts:?}");
}

#[test]
fn different_searches_with_the_same_hits_are_same_outcome_for_tools_that_look() {
    let hits = "1. Lithium-ion battery recycling rates 2023 (IEA) https://www.iea.org/reports/batteries-2023: \
        globally around five percent of lithium-ion batteries were recycled, with Europe ahead of \
        other regions.\n2. Battery recycling market report https://example.org/battery-market: the \
        recycling market is projected to grow through the decade as collection improves.";
    let mut h = H::default();
    let queries = [
        "EU lithium-ion battery recycling rate 2023",
        "share of Li-ion batteries recycled EU 2023",
        "European lithium-ion battery recycling statistics 2023",
        "percentage of lithium-ion batteries recycled in Europe 2023",
    ];
    for (i, q) in queries.into_iter().enumerate() {
        let (_, r) = h.run("web_search", json!({ "query": q }), hits, false);
        if i < 3 {
            assert!(r.is_allow(), "{q}: {r:?}");
        } else {
            assert_eq!(det(&r), Some("same_outcome"), "{r:?}");
            assert_eq!(r.count, 4);
        }
    }
    // An editing tool's answer is not counted (`include_success` is the exploration
    // category's), nor is a short acknowledgement.
    let mut h = H::default();
    for i in 0..6 {
        let path = format!("src/m{i}.rs");
        let (_, r) = h.run(
            "edit_file",
            json!({ "path": path, "old": "a", "new": "b" }),
            hits,
            false,
        );
        assert!(r.is_allow(), "{r:?}");
    }
    for i in 0..6 {
        let (_, r) = h.run(
            "read_file",
            json!({ "path": format!("src/n{i}.rs") }),
            "ok",
            false,
        );
        assert!(r.is_allow(), "{r:?}");
    }
}

#[test]
fn the_call_after_a_wait_tool_polls() {
    let spinner =
        "Page URL: https://dash.example.com/login\nPage Title: Signing in\n- progressbar [ref=e20]";
    let mut h = H::default();
    // Waiting and looking, four rounds with nothing new yet: waiting, not a loop.
    for i in 0..4 {
        let (c, r) = h.run(
            "browser_wait_for",
            json!({"time": 3}),
            "Waited for 3 seconds",
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "wait {i}: {c:?} {r:?}");
        let (c, r) = h.run("browser_snapshot", json!({}), spinner, false);
        assert!(c.is_allow() && r.is_allow(), "look {i}: {c:?} {r:?}");
    }
    // A page that never changes is still a loop, later.
    let mut flagged = None;
    for i in 4..12 {
        h.run(
            "browser_wait_for",
            json!({"time": 3}),
            "Waited for 3 seconds",
            false,
        );
        let (c, r) = h.run("browser_snapshot", json!({}), spinner, false);
        if flagged.is_none() && !(c.is_allow() && r.is_allow()) {
            flagged = Some(i + 1);
        }
    }
    assert!(flagged.is_some_and(|n| n <= 8), "{flagged:?}");
    // Without the waits the same looks are flagged as before.
    let mut h = H::default();
    let looks: Vec<bool> = (0..4)
        .map(|_| {
            let (c, r) = h.run("browser_snapshot", json!({}), spinner, false);
            c.is_allow() && r.is_allow()
        })
        .collect();
    assert_eq!(looks, [true, true, false, false]);
}

#[test]
fn an_agents_own_todo_list_set_again_between_work_is_no_loop() {
    let todos = json!({"todos": [
        {"content": "Map the billing module", "status": "in_progress", "activeForm": "Mapping"},
        {"content": "Write the summary", "status": "pending", "activeForm": "Writing"}
    ]});
    let ack = "Todos have been modified successfully. Ensure that you continue to use the todo list to track your progress.";
    let mut h = H::default();
    for i in 0..6 {
        let (c, r) = h.run("TodoWrite", todos.clone(), ack, false);
        assert!(c.is_allow() && r.is_allow(), "todo {i}: {c:?} {r:?}");
        let path = format!("/app/billing/m{i}.py");
        let (c, r) = h.run(
            "Read",
            json!({ "file_path": path }),
            &format!("class M{i}: pass"),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "read {i}: {c:?} {r:?}");
    }
    // The same list back to back, with nothing done between, is a loop.
    let mut h = H::default();
    let verdicts: Vec<bool> = (0..3)
        .map(|_| h.run("TodoWrite", todos.clone(), ack, false).0.is_allow())
        .collect();
    assert_eq!(verdicts, [true, true, false]);
}

#[test]
fn a_poll_is_a_repeat_only_at_twice_the_threshold() {
    let poll = "sleep 10 && kubectl rollout status deploy/api --timeout=5s";
    let waiting = "Waiting for deployment \"api\" rollout to finish: 1 of 3 updated replicas are available...\nerror: timed out waiting for the condition";
    let mut h = H::default();
    assert!(
        h.bash(
            "kubectl apply -f deploy.yaml",
            "deployment.apps/api configured",
            false
        )
        .1
        .is_allow()
    );
    // The shell threshold is 3: a poll may look five times with nothing new.
    for i in 1..=5 {
        let (c, r) = h.bash(poll, waiting, true);
        assert!(c.is_allow() && r.is_allow(), "poll {i}: {c:?} {r:?}");
    }
    let (c, r) = h.bash(poll, waiting, true);
    let flagged = [det(&c), det(&r)];
    assert!(
        flagged.contains(&Some("exact_repeat")) || flagged.contains(&Some("no_progress")),
        "the 6th identical poll: {c:?} {r:?}"
    );
    // The same check without the wait is no poll.
    let mut h = H::default();
    let check = "kubectl rollout status deploy/api --timeout=5s";
    let mut hit = None;
    for i in 1..=4 {
        let (c, r) = h.bash(check, waiting, true);
        if !(c.is_allow() && r.is_allow()) {
            hit = Some(i);
            break;
        }
    }
    assert_eq!(hit, Some(3));
}

#[test]
fn polling_a_background_job_that_says_it_is_still_running_is_a_poll() {
    let running = |t: u32| {
        format!("<status>running</status>\n\n<timestamp>2026-11-26T15:{t:02}:00Z</timestamp>")
    };
    let mut h = H::default();
    let (c, r) = h.run(
        "Bash",
        json!({"command": "find / -name '*.epub'", "run_in_background": true}),
        "Command running in background with ID: 465bc5",
        false,
    );
    assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
    // Looks at a job that is still running: waiting, not a loop, until three times the
    // threshold (3); a job that never finishes is still a loop, and each further flag, up the
    // ladder, takes as many looks again.
    let mut flags = Vec::new();
    for i in 1..=27 {
        let (c, id) = h.call("BashOutput", json!({"bash_id": "465bc5"}));
        let r = if c.action == Action::Block {
            Verdict::allow()
        } else {
            h.result(&id, &running(i), false)
        };
        for v in [c, r] {
            if !v.is_allow() {
                flags.push((i, v.action));
            }
        }
    }
    assert_eq!(
        flags,
        [
            (9, Action::Warn),
            (18, Action::Block),
            (27, Action::Terminate)
        ]
    );
    // The same looks at a job that says nothing of its state are repeats at the threshold.
    let mut h = H::default();
    let looks: Vec<bool> = (0..3)
        .map(|_| {
            let (c, r) = h.run(
                "BashOutput",
                json!({"bash_id": "9"}),
                "no new output",
                false,
            );
            c.is_allow() && r.is_allow()
        })
        .collect();
    assert_eq!(looks, [true, true, false]);
}

/// A wait on a process that says it is still running (Codex's `write_stdin` with nothing to
/// write) is never a repeat, but the same screen again and again is: at the pace of a poll of
/// work still under way.
#[test]
fn waiting_on_a_process_that_never_ends_is_flagged_at_the_pace_of_a_poll() {
    let mut h = H::default();
    let (c, r) = h.run(
        "exec_command",
        json!({"cmd": "npm run serve", "yield_time_ms": 10000}),
        "Process running with session ID 3\nOutput:\n> serve\n",
        false,
    );
    assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
    let mut flags = Vec::new();
    for i in 1..=19 {
        let (c, id) = h.call(
            "write_stdin",
            json!({"session_id": 3, "chars": "", "yield_time_ms": 30000}),
        );
        let r = if c.action == Action::Block {
            Verdict::allow()
        } else {
            h.result(&id, "Process running with session ID 3\nOutput:\n", false)
        };
        for v in [c, r] {
            if !v.is_allow() {
                flags.push((i, v.action, v.detector.unwrap_or_default().into_owned()));
            }
        }
    }
    assert_eq!(
        flags,
        [
            (9, Action::Warn, "no_progress".to_owned()),
            // A loop found in a result: the call already ran, so the next one is refused.
            (18, Action::Warn, "no_progress".to_owned()),
            (19, Action::Block, "no_progress".to_owned())
        ]
    );
}

#[test]
fn pending_patterns_read_both_ends_of_a_successful_result() {
    let c = default_config();
    let p = &c.results.pending_patterns;
    let pending = |s: &str| super::session::pending_for_tests(p, s);
    assert!(pending(
        "{\"id\": 7, \"status\": \"in_progress\", \"conclusion\": null}"
    ));
    assert!(pending("build 41 is still running"));
    assert!(pending(
        "Chunk ID: 4f1a\nWall time: 5.0 seconds\nProcess running with session ID 3\nOutput:\nCompiling app v0.1.0"
    ));
    assert!(!pending(
        "Chunk ID: 4f1a\nWall time: 0.2 seconds\nProcess exited with code 0\nOutput:\nok"
    ));
    assert!(pending(&format!(
        "{}\nWaiting for deployment \"api\" rollout to finish: 1 of 3 updated",
        "log line\n".repeat(200)
    )));
    assert!(!pending("status: completed\nconclusion: success"));
    assert!(!pending("def run_in_background(job): ..."));
    assert!(!pending(""));
}

/// A wait that shows something (a terminal's screen after an empty batch of keystrokes, to
/// whatever tool it is sent, a page after `browser_wait_for`) looks, as a poll does: the same screen again and again is
/// no progress, at twice the threshold; a changing screen is progress, and a wait that shows
/// nothing (`sleep 30`) is never counted.
#[test]
fn a_wait_that_shows_the_same_screen_again_and_again_is_no_progress() {
    let screen = "root@7c1e:/app# python train.py\nLoading dataset...\nEpoch 1/10\n";
    let first_flag = |h: &mut H, tool: &str, args: Value, out: &dyn Fn(usize) -> String| {
        (0..12).position(|i| {
            let (c, r) = h.run(tool, args.clone(), &out(i), false);
            !(c.is_allow() && r.is_allow())
        })
    };
    // An empty batch of keystrokes, and a waiting tool.
    for (tool, args) in [
        ("bash_command", json!({"keystrokes": "", "duration": 30})),
        (
            "send_keystrokes",
            json!({"keystrokes": "", "duration": 120.0}),
        ),
        (
            "write_stdin",
            json!({"session_id": 7, "chars": "", "yield_time_ms": 30000}),
        ),
        ("wait", json!({})),
    ] {
        let mut h = H::default();
        let first = first_flag(&mut h, tool, args.clone(), &|_| screen.to_owned());
        assert_eq!(first, Some(5), "{tool}: the sixth identical screen");
        let mut h = H::default();
        let first = first_flag(&mut h, tool, args, &|i| {
            format!("{screen}Epoch {}/10\n", i + 2)
        });
        assert_eq!(first, None, "{tool}: a changing screen");
    }
    let mut h = H::default();
    assert_eq!(
        first_flag(&mut h, "bash", json!({"command": "sleep 30"}), &|_| {
            String::new()
        }),
        None
    );
}

/// A marker echoed once a command has finished (`echo DONE`, as terminal agents do to see the
/// terminal is free) is known by what was done before it: the same marker after other work is
/// no repeat of it; after the same work again and again, it is.
#[test]
fn the_same_marker_after_other_work_is_no_repeat() {
    let mut h = H::default();
    for i in 0..6 {
        let (c, r) = h.bash(
            &format!("python3 -c 'import app; print(app.check({i}))'"),
            &format!("check {i}: ok"),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "check {i}");
        let (c, r) = h.bash("echo DONE", "DONE", false);
        assert!(
            c.is_allow() && r.is_allow(),
            "marker after check {i}: {c:?} {r:?}"
        );
    }
    // After one command made again and again, the marker counts with it.
    let mut h = H::default();
    let first = (0..6).position(|_| {
        let (c, r) = h.bash("sleep 5 && cat status.txt", "building", false);
        let (c2, r2) = h.bash("echo DONE", "DONE", false);
        [c, r, c2, r2].iter().any(|v| !v.is_allow())
    });
    assert!(first.is_some(), "never flagged");
}

#[test]
fn commands_that_do_nothing_are_one_call_however_they_are_worded() {
    // An agent that thinks it is done, saying so through the shell.
    let mut h = H::default();
    let (c, r) = h.bash("git status -sb", "## main", false);
    assert!(c.is_allow() && r.is_allow());
    let idle = [
        ("true", ""),
        ("echo 'Done again.'", "Done again."),
        ("true", ""),
        ("echo 'Final done'", "Final done"),
        ("true", ""),
        ("printf 'All set\\n'", "All set"),
    ];
    let first = idle.iter().position(|(cmd, out)| {
        let (c, r) = h.bash(cmd, out, false);
        !(c.is_allow() && r.is_allow())
    });
    assert!(
        first.is_some_and(|i| i + 2 <= 6),
        "first at call {:?}",
        first.map(|i| i + 2)
    );
    // Markers that differ by a counter.
    let mut h = H::default();
    let first = (1..=8).position(|i| {
        let (c, r) = h.bash(
            &format!("cmd /c echo marker{i}"),
            &format!("marker{i}"),
            false,
        );
        !(c.is_allow() && r.is_allow())
    });
    assert!(first.is_some_and(|i| i < 6), "{first:?}");
    // Section markers printed on their own between other work are idle only each on its own.
    let mut h = H::default();
    for i in 0..8 {
        let (c, r) = h.bash(
            &format!("echo '=== module {i} ==='"),
            &format!("=== module {i} ==="),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "marker {i}: {c:?} {r:?}");
        let (c, r) = h.run(
            "read_file",
            json!({"path": format!("src/m{i}.py")}),
            "def f(): pass",
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "read {i}: {c:?} {r:?}");
    }
    // An echo beside real work, or of what the shell expands, is no idle call.
    let mut h = H::default();
    for i in 0..6 {
        let (c, r) = h.bash(
            &format!("echo '--- step {i}' && cargo test -p crate{i}"),
            &format!("--- step {i}\ntest result: ok. {i} passed"),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "step {i}: {c:?} {r:?}");
        let (c, r) = h.bash(&format!("echo $STEP_{i}"), &format!("{i}"), false);
        assert!(c.is_allow() && r.is_allow(), "echo {i}: {c:?} {r:?}");
    }
}

/// What a terminal agent types at a shell that no longer answers: liveness probes (`pwd`,
/// `echo alive`, an interrupt typed as `C-c`, a variable set) between waits, nothing done and
/// nothing new shown. The run is stagnation, whether the screens come back empty or the
/// host recorded none.
#[test]
fn a_dead_terminal_probed_between_waits_is_stagnation() {
    let probes = [
        "",
        "pwd",
        "C-c\npwd",
        "",
        "echo alive",
        "restart=true",
        "",
        "echo hi",
        "C-c\nC-c",
        "",
    ];
    let first_flag = |h: &mut H, with_results: bool| {
        probes.iter().position(|cmd| {
            let args = json!({"keystrokes": format!("{cmd}\n"), "duration": 30});
            let (c, id) = h.call("bash_command", args);
            let r = if with_results {
                h.result(&id, "", false)
            } else {
                Verdict::allow()
            };
            !(c.is_allow() && r.is_allow())
        })
    };
    for with_results in [true, false] {
        let mut h = H::default();
        let (c, r) = h.bash("python3 run_pipeline.py --steps 3", "step 1 ok", false);
        assert!(c.is_allow() && r.is_allow());
        // The eighth idle call in a row.
        assert_eq!(first_flag(&mut h, with_results), Some(7), "{with_results}");
    }
}

/// Waits and markers beside a job whose screen moves on watch it, and a run of waits alone
/// shows nothing: neither is stagnation.
#[test]
fn waiting_on_a_job_that_moves_on_is_no_stagnation() {
    let mut h = H::default();
    for i in 0..12 {
        let (c, r) = h.run(
            "bash_command",
            json!({"keystrokes": "", "duration": 20}),
            &format!("Collecting packages...\nDownloading wheel {i}/40\n"),
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "wait {i}: {c:?} {r:?}");
        let (c, r) = h.run(
            "bash_command",
            json!({"keystrokes": "echo DONE\n", "duration": 1}),
            "echo DONE\nDONE\n",
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "marker {i}: {c:?} {r:?}");
    }
    let mut h = H::default();
    for i in 0..12 {
        let (c, r) = h.run("wait", json!({"seconds": 30}), "", false);
        assert!(c.is_allow() && r.is_allow(), "wait {i}: {c:?} {r:?}");
    }
}

#[test]
fn an_edit_made_by_a_script_is_an_edit() {
    let fail = "F\n=== FAILURES ===\ntest_parse_empty\nAssertionError: assert None == []\n1 failed, 11 passed in 0.31s";
    let test = "python -m pytest tests/test_parse.py -q";
    let mut h = H::default();
    let (c, r) = h.bash(test, fail, true);
    assert!(c.is_allow() && r.is_allow());
    // Three different edits, each followed by the same test failing the same way: attempts,
    // judged as test_fix judges failing runs after native edits, not as one call repeated.
    for i in 0..3 {
        let edit = format!(
            "python - <<'EOF'\np='src/parse.py'\ns=open(p).read()\ns=s.replace('return None  # v{i}','return []  # v{}')\nopen(p,'w').write(s)\nEOF",
            i + 1
        );
        let (c, r) = h.bash(&edit, "", false);
        assert!(c.is_allow() && r.is_allow(), "edit {i}: {c:?} {r:?}");
        let (c, r) = h.bash(test, fail, true);
        assert!(c.is_allow() && r.is_allow(), "test {i}: {c:?} {r:?}");
    }
    let rules = crate::fingerprint::FingerprintRules::from_config(&default_config());
    for (cmd, writes) in [
        ("python3 -c \"import os; os.remove('build.lock')\"", true),
        (
            "node -e \"require('fs').writeFileSync('a.json', '{}')\"",
            true,
        ),
        (
            "python3.11 - <<'EOF'\nfrom pathlib import Path\nPath('x').write_text('1')\nEOF",
            true,
        ),
        ("python -c \"import sys; sys.stdout.write('hi')\"", false),
        ("grep -rn '.write(' src/", false),
        ("black src/", true),
        ("perl -pi -e 's/a/b/' f.txt", true),
    ] {
        assert_eq!(rules.modifies(cmd), writes, "{cmd}");
    }
}

#[test]
fn searches_that_find_nothing_are_empty_answers_not_the_same_error() {
    // grep exits 1 when nothing matches: four names looked for are a search.
    for miss in [
        "",
        "exit code 1",
        "Error: Exit code 1",
        "<returncode>1</returncode>\n<output>\n</output>",
    ] {
        let mut h = H::default();
        for (i, q) in ["retry_limit", "max_retries", "RETRY_LIMIT", "retries ="]
            .iter()
            .enumerate()
        {
            let (c, r) = h.bash(&format!("grep -rn '{q}' src/"), miss, miss.is_empty());
            assert!(
                c.is_allow() && r.is_allow(),
                "{miss:?} search {i}: {c:?} {r:?}"
            );
        }
        // Looking on and on without finding anything is still a loop, later.
        let (c, r) = h.bash("grep -rn 'retry' src/", miss, miss.is_empty());
        assert_eq!(det(&r).or(det(&c)), Some("same_outcome"), "{miss:?}");
    }
    // A failure that says what went wrong is an error: three different calls failing the
    // same way are flagged at the third.
    let mut h = H::default();
    let verdicts: Vec<bool> = ["a", "b", "c"]
        .iter()
        .map(|f| {
            let (c, r) = h.bash(
                &format!("make {f}"),
                "make: *** No rule to make target. Stop.",
                true,
            );
            c.is_allow() && r.is_allow()
        })
        .collect();
    assert_eq!(verdicts, [true, true, false]);
}

#[test]
fn silent_shell_commands_are_not_empty_outcomes() {
    let mut h = H::default();
    for d in ["a", "b", "c", "d", "e"] {
        let (c, r) = h.bash(&format!("mkdir {d}"), "", false);
        assert!(c.is_allow() && r.is_allow());
    }
}

#[test]
fn writes_that_report_nothing_are_not_empty_answers() {
    // A host that answers a successful write with an empty result: seven files written.
    let mut h = H::default();
    for i in 0..7 {
        let path = format!("app/m{i}.py");
        let (c, r) = h.run(
            "write_file",
            json!({ "path": path, "content": "x = 1\n" }),
            "",
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "{path}: {c:?} {r:?}");
    }
    // Clicks on a page report nothing either.
    let mut h = H::default();
    for i in 0..7 {
        let (c, r) = h.run(
            "browser_click",
            json!({ "ref": format!("e{i}") }),
            "",
            false,
        );
        assert!(c.is_allow() && r.is_allow(), "click {i}: {c:?} {r:?}");
    }
    // The same write again changes nothing: it is no new work, and its empty result counts.
    let mut h = H::default();
    let mut last = None;
    for i in 0..6 {
        let (c, r) = h.run(
            "write_file",
            json!({ "path": "app/m.py", "content": "x = 1\n" }),
            "",
            false,
        );
        last = Some(if c.is_allow() { r } else { c });
        if i < 2 {
            assert!(last.as_ref().is_some_and(Verdict::is_allow), "write {i}");
        }
    }
    assert!(last.is_some_and(|v| !v.is_allow()));
}

#[test]
fn a_look_at_the_screen_after_each_action_is_no_repeat() {
    // A computer-use agent: every action returns a screenshot, here without its image data;
    // the screenshot action between them only looks.
    let mut h = H::default();
    let actions = [
        json!({"action": "screenshot"}),
        json!({"action": "left_click", "coordinate": [320, 212]}),
        json!({"action": "screenshot"}),
        json!({"action": "type", "text": "Boston"}),
        json!({"action": "screenshot"}),
        json!({"action": "key", "text": "Return"}),
        json!({"action": "screenshot"}),
        json!({"action": "left_click", "coordinate": [610, 212]}),
        json!({"action": "screenshot"}),
    ];
    for a in actions {
        let (c, r) = h.run("computer", a.clone(), "", false);
        assert!(c.is_allow() && r.is_allow(), "{a}: {c:?} {r:?}");
    }
    // The same click again and again, with a look between and nothing changing, is a loop.
    let mut h = H::default();
    let mut flagged = None;
    for i in 0..6 {
        let a = if i % 2 == 0 {
            json!({"action": "left_click", "coordinate": [980, 640]})
        } else {
            json!({"action": "screenshot"})
        };
        let (c, _) = h.run("computer", a, "", false);
        if flagged.is_none() && !c.is_allow() {
            flagged = Some(i);
        }
    }
    assert_eq!(flagged, Some(4), "the third click");
    // Looking changes nothing: the same failing command between looks is a loop.
    let mut h = H::default();
    let mut flagged = None;
    for (i, look) in ["screenshot", "cursor_position", "screenshot"]
        .into_iter()
        .enumerate()
    {
        let (c, _) = h.run("computer", json!({ "action": look }), "", false);
        assert!(c.is_allow());
        let (c, _) = h.bash("npm run build", "npm ERR! Missing script: \"build\"", true);
        if flagged.is_none() && !c.is_allow() {
            flagged = Some(i);
        }
    }
    assert_eq!(flagged, Some(2), "the third build");
}

#[test]
fn a_framework_refusing_a_repeated_call_is_no_new_outcome() {
    // CrewAI answers a call made again with the same input by refusing to run it. The refusal
    // is no change from the data the first call brought: each refused call is one more try.
    const GUARD: &str = "I tried reusing the same input, I must stop using this action input. \
                         I'll try something else instead.\n\n";
    let first_flag = |mut h: H, guard: &str| {
        (1..=6).find(|_| {
            let (c, _) = h.run(
                "scrape_reddit",
                json!({"max_comments_per_post": 7}),
                if h.n == 0 {
                    "r/ai: 7 posts, 49 comments"
                } else {
                    guard
                },
                false,
            );
            !c.is_allow()
        })
    };
    assert_eq!(first_flag(H::default(), GUARD), Some(3));
    // Claude Code answers a file read again, unchanged since, with a notice in its place.
    for notice in [
        "Wasted call — file unchanged since your last Read. Refer to that earlier tool_result \
         instead.",
        "File unchanged since last read. The content from the earlier Read tool_result is \
         still current.",
        "Unchanged since last read",
    ] {
        assert_eq!(first_flag(H::default(), notice), Some(3), "{notice}");
    }
    // Read as a changed result, the refusal restarts the count.
    let without = config("version: 1\nresults: { refused_patterns: [] }\n");
    assert_eq!(first_flag(H::new(without), GUARD), Some(4));
}

/// Eight different git spellings of one question about an untouched working tree.
const STATE_QUERIES: [&str; 8] = [
    "git status",
    "git diff --stat",
    "git status --porcelain",
    "git diff --name-only HEAD",
    "git -C . status -sb",
    "git --no-pager diff --stat",
    "git ls-files -m",
    "git status --short && git diff --stat",
];

#[test]
fn state_queries_in_a_row_are_stagnation() {
    let mut h = H::default();
    for (i, cmd) in STATE_QUERIES.iter().enumerate() {
        // Each answer differs: the queries ask differently, not for anything new.
        let (c, r) = h.bash(cmd, &format!(" M src/lib.rs\n{i}"), false);
        assert!(r.is_allow(), "{cmd}");
        if i + 1 < STATE_QUERIES.len() {
            assert!(c.is_allow(), "{cmd}: {c:?}");
        } else {
            assert_eq!(det(&c), Some("stagnation"), "{cmd}");
            assert_eq!(c.action, Action::Warn);
            // The run is named from its first query (its id is older than the few the
            // session keeps).
            assert_eq!(c.loop_start.as_ref().map(|s| s.seq), Some(1));
            assert_eq!(c.count, 8);
        }
    }
    // The next query goes on up the ladder.
    let (c, _) = h.bash("git diff --stat", "x", false);
    assert_eq!(det(&c), Some("stagnation"));
    assert!(c.action > Action::Warn, "{c:?}");
}

#[test]
fn anything_done_between_state_queries_ends_the_run() {
    for between in [
        json!({"path": "src/lib.rs"}),
        json!({"command": "cargo test"}),
        json!({"command": "git diff -- src/lib.rs"}),
    ] {
        let mut h = H::default();
        for (i, cmd) in STATE_QUERIES.iter().enumerate() {
            if i == 4 {
                let tool = if between.get("path").is_some() {
                    "read_file"
                } else {
                    "bash"
                };
                let (c, _) = h.run(tool, between.clone(), "ok", false);
                assert!(c.is_allow());
            }
            let (c, _) = h.bash(cmd, "ok", false);
            assert!(c.is_allow(), "{between} then {cmd}: {c:?}");
        }
    }
}

#[test]
fn stagnation_is_switched_off_and_tuned_by_the_policy() {
    let mut h = H::new(config(
        "version: 1\ndetectors:\n  stagnation: { enabled: false }\n",
    ));
    for cmd in STATE_QUERIES {
        assert!(h.bash(cmd, "ok", false).0.is_allow(), "{cmd}");
    }
    let mut h = H::new(config(
        "version: 1\ndetectors:\n  stagnation: { threshold: 3 }\n",
    ));
    assert!(h.bash("git status", "a", false).0.is_allow());
    assert!(h.bash("git diff", "b", false).0.is_allow());
    assert_eq!(
        det(&h.bash("git ls-files -m", "c", false).0),
        Some("stagnation")
    );
    let mut h = H::new(config(
        "version: 1\nshell:\n  state_queries: [kubectl get]\ndetectors:\n  stagnation: { threshold: 2 }\n",
    ));
    assert!(h.bash("git status", "a", false).0.is_allow());
    assert!(h.bash("git status -s", "a", false).0.is_allow());
    assert!(h.bash("kubectl get pods", "a", false).0.is_allow());
    assert_eq!(
        det(&h.bash("kubectl get svc", "b", false).0),
        Some("stagnation")
    );
}

#[test]
fn failing_file_commands_cascade_with_a_hint() {
    let mut h = H::default();
    for i in 0..4 {
        let r = h
            .bash(
                &format!("sed -i 's/a/b/' f{i}.txt"),
                &format!("sed: f{i}.txt: error {i}"),
                true,
            )
            .1;
        assert!(r.is_allow(), "{i}: {r:?}");
    }
    let r = h.bash("sed -i 's/a/b/' g.txt", "sed: g.txt: other", true).1;
    assert_eq!(det(&r), Some("error_cascade"));
    assert!(r.message.contains("file tools"), "{}", r.message);
    assert_eq!(r.calls.len(), 5);
    // When the ladder reaches `block` on a result, the warning that announces the refusal of
    // the next call keeps the hint.
    let r = h.bash("sed -i 's/a/b/' h.txt", "sed: h.txt: other", true).1;
    assert_eq!(r.action, Action::Warn, "{r:?}");
    assert!(r.message.contains("will be refused"), "{}", r.message);
    assert!(r.message.contains("file tools"), "{}", r.message);
}

#[test]
fn unknown_tools() {
    let mut h = H::default();
    let (c, id) = h.call("frobnicate", json!({"x": 1}));
    assert!(c.is_allow());
    h.result(&id, "Error: unknown tool `frobnicate`", true);
    let (c, _) = h.call("frobnicate", json!({"x": 2}));
    assert_eq!(det(&c), Some("unknown_tool"));

    let mut h = H::new(config(
        "version: 1\ndetectors: { unknown_tool: { known_tools: [bash, \"mcp__*\"] } }\n",
    ));
    assert!(h.call("mcp__x__y", json!({})).0.is_allow());
    assert!(h.call("nope", json!({"a": 1})).0.is_allow());
    assert_eq!(
        det(&h.call("nope", json!({"a": 2})).0),
        Some("unknown_tool")
    );
}

/// The unknown-tool patterns read a whole output, however long (a few MiB of non-ASCII text
/// took seconds); they read its first and last 512 bytes, where a harness says a tool does not
/// exist.
#[test]
fn unknown_tool_patterns_read_only_the_ends_of_a_result() {
    let filler = "tool é output ".repeat(200);
    for (output, unknown) in [
        (format!("Error: unknown tool `frobnicate`\n{filler}"), true),
        (format!("{filler}\nError: unknown tool `frobnicate`"), true),
        (
            format!("{filler}\nError: unknown tool `frobnicate`\n{filler}"),
            false,
        ),
    ] {
        let mut h = H::default();
        let (_, id) = h.call("frobnicate", json!({"x": 1}));
        h.result(&id, &output, true);
        let (c, _) = h.call("frobnicate", json!({"x": 2}));
        assert_eq!(
            det(&c) == Some("unknown_tool"),
            unknown,
            "{:?}",
            &output[..40]
        );
    }
}

// --- text -----------------------------------------------------------------------------------------

#[test]
fn monologue_and_its_reset() {
    let mut h = H::default();
    for word in ["first", "second", "third", "fourth", "fifth"] {
        assert!(
            h.text(&format!("thinking about the {word} part"), false, false)
                .is_allow()
        );
    }
    let v = h.text("still thinking", false, false);
    assert_eq!(det(&v), Some("monologue"));
    let mut h = H::default();
    for i in 0..5 {
        h.text(&format!("step {i}"), false, false);
    }
    h.call("ls", json!({}));
    assert!(h.text("", false, false).is_allow());
    // Streamed chunks are one turn.
    for _ in 0..10 {
        assert!(h.text("chunk ", true, false).is_allow());
    }
}

/// An AutoGen executor answered every reply with the same `exitcode: 1 … unknown language`;
/// the replies, each a new apology, were judged as a person's messages and nothing was found.
#[test]
fn turns_each_answered_by_the_same_automated_reply_are_a_monologue_sooner() {
    // The count of the first monologue flag over six turns, each followed by `reply(word)`.
    let first_flag = |reply: &dyn Fn(&str) -> String| {
        let mut h = H::default();
        let mut flagged = None;
        for word in ["first", "second", "third", "fourth", "fifth", "sixth"] {
            let v = h.text(
                &format!("Here is the {word} try: a manifest."),
                false,
                false,
            );
            if flagged.is_none() && det(&v) == Some("monologue") {
                flagged = Some(v.count);
            }
            h.user(&reply(word), false);
        }
        flagged
    };
    let rejection = "exitcode: 1 (execution failed)\nCode output: \nunknown language yaml";
    assert_eq!(
        first_flag(&|_| rejection.to_owned()),
        Some(3),
        "the 3rd turn answered by the same rejection"
    );
    // Replies that differ leave the monologue at its own threshold.
    assert_eq!(
        first_flag(&|w| format!("exitcode: 1 (execution failed)\nCode output: \nno {w}")),
        Some(6)
    );
    // A prompt to go on rejects nothing: the next turn may be new work.
    assert_eq!(first_flag(&|_| "Please continue.".to_owned()), Some(6));
}

/// A coding agent's host rejecting turns without a tool call (Cline, Roo Code, Kilo Code) sends
/// the same rejection each time with its environment block (a clock, a cost) after it: the
/// same rejection all the same.
#[test]
fn the_same_rejection_with_a_clock_after_it_is_the_same_reply() {
    let rejection = |i: usize| {
        format!(
            "[ERROR] You did not use a tool in your previous response! Please retry with a tool \
             use.\n\n# Next Steps\n\nIf you have completed the user's task, use the \
             attempt_completion tool.\n(This is an automated message, so do not respond to it \
             conversationally.)\n<environment_details>\n# Current Time\nCurrent time in \
             ISO 8601 UTC format: 2025-11-24T13:5{i}:0{i}.873Z\n\n# Current Cost\n${i}.0{i}\n\
             </environment_details>"
        )
    };
    let mut h = H::default();
    let turns = ["", "I will write the report now:", ""];
    assert_eq!(h.first_monologue(&turns, |n| rejection(n - 1)), Some(3));
}

/// The same check asked again and again, typed with other spacing around its `&&` each time
/// (`cd repo&& git status -sb`, `cd repo && git status -sb`), is one call.
#[test]
fn the_same_command_spaced_otherwise_is_a_repeat() {
    let mut h = H::default();
    let first = [
        "cd /srv/app&& git status -sb",
        "cd /srv/app && git status -sb",
        "cd /srv/app&& git status -sb",
        "cd /srv/app && git status -sb",
        "cd /srv/app &&git status -sb",
    ]
    .iter()
    .position(|cmd| {
        let (c, r) = h.bash(cmd, "## main...origin/main", false);
        !(c.is_allow() && r.is_allow())
    });
    assert_eq!(first, Some(3), "the fourth check");
}

/// A pipeline that numbers its retries (`Attempt 2 failed validation`) sends the same reply
/// each time: from its second sending on it is the pipeline's, not a person's, and the turns
/// it rejects add up.
#[test]
fn a_reply_numbering_its_attempts_is_the_same_reply() {
    let reply = |n: usize| {
        format!(
            "<validation-feedback>\nAttempt {n} failed validation.\n\nThe output file \
             `./out.json` does not exist yet.\n</validation-feedback>\n\nOutput the result as \
             JSON to: `./out.json`"
        )
    };
    let turns = [
        "Your message only pastes a task; tell me if you want me to run it.",
        "I still have not created any files; there is no request of yours in this one.",
        "This is the same pipeline retry again, so I am leaving things as they are.",
        "Attempt 3 failed for the same reason; reply in your own words to go on.",
    ];
    assert_eq!(H::default().first_monologue(&turns, reply), Some(3));
}

/// Three searches failing the same way, the `i`th after the user message `prompt(i)`: whether
/// any of them is flagged.
fn failing_greps(prompt: &dyn Fn(usize) -> String) -> bool {
    let mut h = H::default();
    let mut flagged = false;
    for (i, cmd) in [
        "grep -r RST src/",
        "grep -r RST src/io/",
        "grep -H RST src/io/*.py",
    ]
    .into_iter()
    .enumerate()
    {
        h.user(&prompt(i), false);
        let (c, r) = h.bash(cmd, "grep: src/: No such file or directory", true);
        flagged |= !c.is_allow() || !r.is_allow();
    }
    flagged
}

/// A framework's fixed prompt sent before every step (the same words each time) is no new
/// instruction: varied calls failing the same way between such prompts are a loop. Messages
/// that differ are a person's, and each sets the calls before it aside.
#[test]
fn a_user_message_said_again_word_for_word_is_no_new_instruction() {
    // A framework's fixed prompt in words no pattern knows.
    let fixed = "Decide on the single next step toward the goal, and reply in the format agreed \
                 at the start:";
    assert!(
        failing_greps(&|_| fixed.to_owned()),
        "the same prompt each step"
    );
    assert!(
        !failing_greps(&|i| format!("{fixed} (step {})", ["one", "two", "three"][i])),
        "messages that differ"
    );
    // A person answers each question with the same short words: each is an answer.
    assert!(
        !failing_greps(&|_| "Yes, do it".to_owned()),
        "short answers"
    );
}

/// Frameworks that read the model's action out of its text answer an action they could not read
/// with a user message of their own: Terminus' `Previous response had parsing errors:` (or
/// `warnings:`), its `ERROR!! NONE of the actions you just requested were performed`, AutoGPT's
/// `Determine exactly one command to use`. Each says something new in its details, yet none is
/// a person's instruction: the failing call before and after it keeps counting.
#[test]
fn a_frameworks_rejection_of_an_unreadable_action_is_no_instruction() {
    for prompt in [
        "Previous response had parsing errors:\nERROR: Missing required field 'plan' (try {i})\n\nPlease fix these issues and provide a proper JSON response.",
        "Previous response had warnings:\nWARNINGS: - Extra text detected before JSON object ({i})",
        "ERROR!! NONE of the actions you just requested were performed because you exceeded the maximum output length of 4096 tokens ({i}).",
        "Determine exactly one command to use based on the progress so far (step {i}), and respond using the JSON schema specified previously:",
    ] {
        assert!(
            failing_greps(&|i| prompt.replace("{i}", &i.to_string())),
            "{prompt}"
        );
    }
    assert!(
        !failing_greps(&|i| format!("Try the integration suite instead, part {i}.")),
        "a person's new instruction"
    );
}

/// Hosts add their own text to tool results: Claude Code a `<system-reminder>` (every so often
/// one about its todo list), Cline and Roo Code an `<environment_details>` block with the editor's
/// state and the clock. Neither is output of the tool: the same file read again and again is
/// the same outcome whatever reminder rides along, while a file that really changed is not.
#[test]
fn a_hosts_reminder_inside_a_result_is_no_output_of_the_tool() {
    let file = "     1→import os\n     2→from utils import helper\n";
    let reads = |content: &dyn Fn(usize) -> String| {
        let mut h = H::default();
        (0..6)
            .map(|i| {
                let (c, r) = h.run(
                    "Read",
                    json!({"file_path": "/repo/app.py"}),
                    &content(i),
                    false,
                );
                !c.is_allow() || !r.is_allow()
            })
            .position(|flagged| flagged)
    };
    let claude = |i: usize| {
        let todo = if i % 2 == 1 {
            "\n<system-reminder>\nThe TodoWrite tool hasn't been used recently.\n</system-reminder>"
        } else {
            ""
        };
        format!(
            "{file}\n<system-reminder>\nConsider whether it is malware.\n</system-reminder>{todo}"
        )
    };
    let cline = |i: usize| {
        format!(
            "{file}\n<environment_details>\n# Current Time\n11/27/2026, 5:0{i}:12 PM (UTC)\n# Current Cost\n$0.0{i}\n</environment_details>"
        )
    };
    assert_eq!(reads(&claude), Some(2), "Claude Code's reminders");
    assert_eq!(reads(&cline), Some(2), "Cline's editor state");
    // The file itself changing each time is another matter.
    let edited = |i: usize| {
        format!(
            "{}\n<system-reminder>\nx\n</system-reminder>",
            "x = 1\n".repeat(i + 1)
        )
    };
    assert_eq!(reads(&edited), None, "a file that changes");
}

/// A check the host runs after every turn, failing the same way each time, answered as a user
/// message (Aider reflecting a failing test command's output): short as it is, its second
/// sending in the same words is the host's reply rejecting the turn, and so was the first.
/// Three turns each rejected alike are a monologue (`monologue.same_reply_threshold`).
#[test]
fn turns_each_rejected_by_the_same_short_check_output_are_a_monologue_sooner() {
    let first_flag = |reply: &str| {
        let turns = [
            "Creating the three module files now, then a compile check.",
            "The directory is missing, so I will output the same files again.",
            "The error means src is missing; here are the files once more.",
            "The error means src is missing; here are the files once more.",
            "Writing all three files again with the full contents.",
        ];
        H::default().first_monologue(&turns, |_| reply.to_owned())
    };
    assert_eq!(first_flag("find: src: No such file or directory"), Some(3));
    // A person's short answer, the same each time, rejects nothing: each one is an answer.
    assert_eq!(first_flag("ok, go ahead"), None);
}

/// A framework's own "go on" prompt, in words no pattern knows, sent after every turn without
/// a tool call: from its second sending on it is the framework's, so the turns add up to a
/// monologue, and turns each answered by that same prompt are flagged at
/// `monologue.same_reply_threshold`: the agent is told the same thing and neither acts nor
/// ends.
#[test]
fn turns_each_followed_by_the_same_long_prompt_are_a_monologue_sooner() {
    let prompt = "Proceed. You can run code on this machine. If the whole task is done, say \
                  exactly 'The task is done.' Otherwise keep going.";
    let plans = [
        "I will load the file with pandas and plot the totals.",
        "First I read the CSV file, then I draw a bar chart.",
        "Let me open data.csv and make a chart of each month.",
        "The plan: parse the rows, sum them by month, plot.",
        "Reading the data now; a line chart will follow it.",
        "I am going to chart the monthly sums from the file.",
    ];
    // The first prompt is taken for a person's until its second sending shows it is the
    // host's: then the turn it ended counts again, and it was the same reply to it.
    let flagged = H::default().first_monologue(&plans, |_| prompt.to_owned());
    assert_eq!(flagged, Some(3));
    // Prompts in other words each time (a person answering) leave the plain threshold.
    let flagged = H::default().first_monologue(&plans, |n| format!("{prompt} ({n} of 6)"));
    assert_eq!(flagged, None);
}

/// A known prompt to go on (OpenHands' fake user) after each turn written as a call the host
/// never ran: the third such turn is flagged, though each says something else.
#[test]
fn turns_each_answered_by_a_known_continue_prompt_are_a_monologue_sooner() {
    let prompt = "Please continue on whatever approach you think is suitable.\nIf you think you \
                  have solved the task, please finish the interaction.";
    let turns = [
        "<finish>\n<parameter=message>Complete</parameter>\n</finish>",
        "<finish>\n<parameter=message>Done</parameter>\n</finish>",
        "<finish>\n<parameter=message>End</parameter>\n</finish>",
    ];
    assert_eq!(
        H::default().first_monologue(&turns, |_| prompt.to_owned()),
        Some(3)
    );
    // A call between the turns is action: the count starts again.
    let mut h = H::default();
    let mut flagged = None;
    for (n, turn) in (1..).zip(turns.iter().cycle().take(6)) {
        if det(&h.text(turn, false, false)) == Some("monologue") && flagged.is_none() {
            flagged = Some(n);
        }
        h.user(prompt, false);
        if n % 2 == 0 {
            h.call("bash", json!({"command": format!("pytest -k case_{n}")}));
        }
    }
    assert_eq!(flagged, None);
}

/// A bare `continue` may be a person's, reading a long answer in parts: it is no fixed reply
/// that brings the flag sooner (the plain `monologue.threshold` still holds).
#[test]
fn a_bare_continue_is_no_fixed_reply() {
    let parts = [
        "Part 1: setup. Install the toolchain and start the local stack.",
        "Part 2: review. Every change needs one approval from an owner.",
        "Part 3: deploys. Main deploys to staging on every merge.",
        "Part 4: on-call. Each engineer joins the rotation after six weeks.",
        "Part 5: help. Ask in the team channel or at office hours.",
    ];
    assert_eq!(
        H::default().first_monologue(&parts, |_| "continue".to_owned()),
        None
    );
}

#[test]
fn repeated_turns_are_text_repeat() {
    let mut h = H::default();
    assert!(
        h.text("I apologize, the report is not ready yet.", false, false)
            .is_allow()
    );
    h.user("any update?", false);
    assert!(
        h.text("I apologize,  the report is not READY yet.", false, false)
            .is_allow()
    );
    h.user("hello? we are going in circles", false);
    let v = h.text("i apologize, the report is not ready yet.", false, false);
    assert_eq!(det(&v), Some("text_repeat"));
    // The same status line after new calls each time is not a repeated turn.
    let mut h = H::default();
    for i in 0..5 {
        assert!(h.text("Sent you a preview in DM.", false, false).is_allow());
        h.call("send_message", json!({"text": format!("draft {i}")}));
    }
    // Short turns are ignored.
    let mut h = H::default();
    for _ in 0..4 {
        assert!(h.text("ok", false, false).is_allow());
        h.call("ls", json!({}));
        h.user("go on", false);
    }
}

#[test]
fn chanting_is_caught_while_streaming() {
    let mut h = H::default();
    let mut fired = None;
    for _ in 0..8 {
        let v = h.text("I will now fix the failing test. ", true, false);
        if !v.is_allow() && fired.is_none() {
            fired = Some(v);
        }
    }
    let v = fired.expect("chanting fires mid-stream");
    assert_eq!(det(&v), Some("chanting"));
    assert!(h.text("", true, true).is_allow() || h.flags() >= 1);
}

// --- scopes -------------------------------------------------------------------------------------

#[test]
fn ttl_expires_by_event_time() {
    let mut h = H::new(config("version: 1\ntime: { ttl_seconds: 60 }\n"));
    let args = json!({"command": "ls"});
    h.call("bash", args.clone());
    h.call("bash", args.clone());
    h.t += 120_000;
    assert!(h.call("bash", args.clone()).0.is_allow());
    assert!(h.call("bash", args.clone()).0.is_allow());
    assert_eq!(h.call("bash", args).0.action, Action::Warn);
}

#[test]
fn user_message_resets_but_injected_nudge_does_not() {
    let mut h = H::default();
    let args = json!({"command": "make"});
    h.call("bash", args.clone());
    h.call("bash", args.clone());
    assert_eq!(h.call("bash", args.clone()).0.action, Action::Warn);
    h.user("try once more please", false);
    h.call("bash", args.clone());
    h.call("bash", args.clone());
    // The loop counter was reset too: this is a first warning again, and flags were kept.
    let v = h.call("bash", args.clone()).0;
    assert_eq!(v.action, Action::Warn);
    assert_eq!(h.flags(), 2);

    let mut h = H::default();
    h.call("bash", args.clone());
    h.call("bash", args.clone());
    h.user("[loopguard] you are repeating yourself", true);
    assert_eq!(h.call("bash", args).0.action, Action::Warn);
}

#[test]
fn reset_forgets_everything() {
    let mut h = H::default();
    let args = json!({"command": "make"});
    for _ in 0..3 {
        h.call("bash", args.clone());
    }
    assert_eq!(h.flags(), 1);
    let time_ms = h.tick();
    h.engine.observe(&Event::Reset {
        session: "s",
        time_ms,
    });
    assert_eq!(h.flags(), 0);
    assert!(h.call("bash", args.clone()).0.is_allow());
    assert!(h.call("bash", args).0.is_allow());
}

#[test]
fn sessions_are_isolated_and_evicted() {
    let mut h = H::default();
    let args = json!({"command": "make"});
    h.call("bash", args.clone());
    h.call("bash", args.clone());
    h.session = "other".into();
    assert!(h.call("bash", args.clone()).0.is_allow());
    h.session = "s".into();
    assert_eq!(h.call("bash", args).0.action, Action::Warn);
    assert_eq!(h.engine.session_count(), 2);
    assert_eq!(h.engine.evict_idle(h.t + 10_000), 0);
    assert_eq!(h.engine.evict_idle(h.t + 3_600_000), 2);
    assert_eq!(h.engine.session_count(), 0);
}

#[test]
fn engine_is_shared_across_threads() {
    let engine = Engine::new(default_config());
    let args = json!({"command": "make"});
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (engine, args) = (&engine, &args);
            scope.spawn(move || {
                for s in 0..25 {
                    let session = format!("t{t}-s{s}");
                    let verdicts: Vec<Action> = (0..3)
                        .map(|i| {
                            let id = format!("c{i}");
                            engine
                                .observe(&Event::Call(Call {
                                    session: &session,
                                    call_id: &id,
                                    tool: "bash",
                                    arguments: Arguments::Json(args),
                                    time_ms: i,
                                }))
                                .action
                        })
                        .collect();
                    assert_eq!(verdicts, [Action::Allow, Action::Allow, Action::Warn]);
                }
            });
        }
    });
    assert_eq!(engine.session_count(), 100);
}

#[test]
fn session_memory_stays_small() {
    let mut h = H::default();
    for i in 0..100 {
        h.run("read_file", json!({"path": format!("f{i}.rs")}), "x", false);
    }
    let bytes = h.engine.with_session("s", |s| s.memory_bytes()).unwrap();
    eprintln!("session memory: {bytes} bytes");
    assert!(bytes <= 1536, "{bytes} bytes");
}

#[test]
fn a_session_flagged_often_gets_no_more_warnings() {
    let mut h = H::default();
    for i in 0..4 {
        let cmd = format!("make target{i}");
        h.bash(&cmd, "x", false);
        h.bash(&cmd, "x", false);
        assert_eq!(h.bash(&cmd, "x", false).0.action, Action::Warn);
        h.user("ok, try something else", false);
    }
    assert_eq!(h.flags(), 4);
    h.bash("make final", "x", false);
    h.bash("make final", "x", false);
    let v = h.bash("make final", "x", false).0;
    assert_eq!(v.action, Action::Block);
    assert_eq!(
        v.rule.as_deref(),
        Some("categories.shell/ladders.default[1]")
    );
    assert!(v.message.contains("looped 4 times"), "{}", v.message);
}

#[test]
fn detector_ladder_overrides_and_templates() {
    let mut h = H::new(config(
        r#"version: 1
escalation: { ladder: mine }
ladders:
  mine:
    - { repeat: 1, action: ask }
    - { repeat: 2, action: terminate }
  strict:
    - { repeat: 1, action: block, message: "{detector} on {file} in {category} ({count}/{threshold}, window {window}, {rule}, {action}) {{x}}" }
categories:
  reads:
    tools: [read_file]
    detectors: { exact_repeat: { ladder: strict } }
"#,
    ));
    let args = json!({"path": "src/lib.rs"});
    h.run("read_file", args.clone(), "x", false);
    h.run("read_file", args.clone(), "x", false);
    let v = h.call("read_file", args).0;
    assert_eq!(
        v.message,
        "exact_repeat on src/lib.rs in reads (3/3, window 30, categories.reads/ladders.strict[0], block) {x}"
    );
    // No message in the step: a default one for the action.
    let a = json!({"q": 1});
    h.call("other", a.clone());
    h.call("other", a.clone());
    let v = h.call("other", a).0;
    assert_eq!(v.action, Action::Ask);
    assert!(v.message.contains("Ask the user"), "{}", v.message);
}

#[test]
fn raw_arguments_and_stray_results() {
    let mut h = H::default();
    let time_ms = h.tick();
    let raw = |id: &'static str| {
        Event::Call(Call {
            session: "s",
            call_id: id,
            tool: "bash",
            arguments: Arguments::Raw(r#"{"command":  "ls"}"#),
            time_ms,
        })
    };
    assert!(h.engine.observe(&raw("r1")).is_allow());
    assert!(h.call("bash", json!({"command": "ls"})).0.is_allow());
    assert_eq!(h.engine.observe(&raw("r3")).action, Action::Warn);
    // A result for a call the engine never saw is ignored.
    assert!(h.result("nobody", "boom", true).is_allow());
}

#[test]
fn reasoning_is_not_a_turn_of_its_own() {
    let mut h = H::default();
    for i in 0..8 {
        let time_ms = h.tick();
        let v = h.engine.observe(&Event::Text(Text {
            session: "s",
            text: if i % 2 == 0 {
                ""
            } else {
                "hmm, let me think about it"
            },
            chunk: false,
            end_of_turn: true,
            reasoning: true,
            narration: false,
            time_ms,
        }));
        assert!(v.is_allow());
    }
    // Eight reasoning-only turns and one empty turn: no monologue, no repeated turn.
    assert!(h.text("", false, false).is_allow());
}

#[test]
fn waiting_is_never_a_repeat() {
    let mut h = H::default();
    for i in 0..8 {
        let (c, r) = h.bash("sleep 30", "", false);
        assert!(c.is_allow() && r.is_allow(), "{i}");
    }
}

proptest::proptest! {
    /// Any sequence of events, with a small window that wraps and a TTL, never panics, and the
    /// verdicts stay consistent (an allow has no calls).
    #[test]
    fn random_sessions_never_panic(ops in proptest::collection::vec((0u8..6, 0u8..4, 0u64..90_000), 1..80)) {
        static SMALL: OnceLock<Config> = OnceLock::new();
        let c = SMALL
            .get_or_init(|| config("version: 1\nwindow: { size: 4 }\ntime: { ttl_seconds: 60 }\ndetectors: { cycle: { max_period: 2 } }\n"))
            .clone();
        let mut h = H::new(c);
        let mut ids: Vec<String> = Vec::new();
        for (op, x, dt) in ops {
            h.t += dt;
            let v = match op {
                0 | 1 => {
                    let (v, id) = h.call(["bash", "read_file", "grep", "nope"][x as usize], json!({"command": format!("cat f{x}"), "path": format!("f{x}")}));
                    ids.push(id);
                    v
                }
                2 => {
                    let id = ids.get(x as usize % ids.len().max(1)).cloned().unwrap_or_default();
                    h.result(&id, ["same", "No matches found", "429 Too Many Requests", "unknown tool"][x as usize], x % 2 == 0)
                }
                3 => h.text("I will fix it now. I will fix it now.", x % 2 == 0, x == 0),
                4 => h.user(["run it 3 times", "go on"][x as usize % 2], x >= 2),
                _ => {
                    let time_ms = h.tick();
                    h.engine.observe(&Event::Reset { session: "s", time_ms })
                }
            };
            proptest::prop_assert!(!v.is_allow() || v.calls.is_empty());
        }
    }
}

// --- refusals decided on a result ----------------------------------------------------------------

#[test]
fn a_block_decided_on_a_result_warns_then_refuses_the_next_call_of_that_tool() {
    let mut h = H::default();
    for i in 0..5 {
        h.bash(
            &format!("deploy --try {i}"),
            &format!("deploy failed: quota {i}"),
            true,
        );
    }
    // The 6th failure reaches the ladder's block step: the call already ran, so the result
    // verdict warns and says what comes next.
    let (c, r) = h.bash("deploy --try 5", "deploy failed: quota 5", true);
    assert!(c.is_allow(), "{c:?}");
    assert_eq!(r.action, Action::Warn, "{r:?}");
    assert_eq!(det(&r), Some("error_cascade"));
    assert!(
        r.message.contains("next bash call will be refused"),
        "{}",
        r.message
    );
    assert!(!r.message.contains("was not run"), "{}", r.message);
    // The next call of the same tool is refused, as a failed call.
    let (next, _) = h.call("bash", json!({"command": "deploy --try 6"}));
    assert_eq!(next.action, Action::Block, "{next:?}");
    assert!(next.message.contains("not run"), "{}", next.message);
}

#[test]
fn a_call_of_another_tool_disarms_a_refusal_decided_on_a_result() {
    let mut h = H::default();
    for i in 0..5 {
        h.bash(
            &format!("deploy --try {i}"),
            &format!("deploy failed: quota {i}"),
            true,
        );
    }
    let (other, id) = h.call("read_file", json!({"path": "deploy.yaml"}));
    assert!(other.is_allow(), "{other:?}");
    h.result(&id, "quota: 3", false);
    let (next, _) = h.call("bash", json!({"command": "kubectl get quota"}));
    assert_ne!(next.action, Action::Block, "{next:?}");
}

// --- progress model ---------------------------------------------------------------------------

/// The same failing call with the same failure, sent again after a person's message that
/// changes nothing ("there is a misunderstanding"), kept its count reset forever.
#[test]
fn a_user_message_that_changes_nothing_does_not_reset_the_loop() {
    let mut h = H::default();
    let args = json!({"command": "npm run deploy"});
    let fail = "Error: missing DEPLOY_TOKEN";
    assert!(h.run("bash", args.clone(), fail, true).0.is_allow());
    assert!(h.run("bash", args.clone(), fail, true).0.is_allow());
    h.user("there is a misunderstanding, please fix the deploy", false);
    // Set aside until the outcome says whether the message changed anything.
    let (c, r) = h.run("bash", args.clone(), fail, true);
    assert!(c.is_allow(), "{c:?}");
    assert_eq!(det(&r), Some("no_progress"), "{r:?}");
    // And a loop that persists climbs the ladder across people's messages.
    let mut worst = Action::Allow;
    for _ in 0..4 {
        h.user("we are going in circles", false);
        let (c, r) = h.run("bash", args.clone(), fail, true);
        worst = worst.max(c.action).max(r.action);
    }
    assert_eq!(worst, Action::Terminate);
}

/// A person's message that changes the outcome (new information) restarts the counts.
#[test]
fn a_user_message_that_changes_the_outcome_restarts_the_counts() {
    let mut h = H::default();
    let args = json!({"command": "npm run deploy"});
    h.run("bash", args.clone(), "Error: missing DEPLOY_TOKEN", true);
    h.run("bash", args.clone(), "Error: missing DEPLOY_TOKEN", true);
    h.user("I exported DEPLOY_TOKEN, try now", false);
    for _ in 0..2 {
        let (c, r) = h.run("bash", args.clone(), "deployed v2 to staging", false);
        assert!(c.is_allow() && r.is_allow(), "{c:?} {r:?}");
    }
}

/// Framework prompts sent as user-role messages ("Please continue", observations) reset
/// nothing: the identical calls between them are one loop.
#[test]
fn automated_prompts_do_not_reset_counts() {
    let prompts = [
        "Please continue.",
        "Observation: done",
        "continue",
        // smolagents: a failed step's observation, and the prompt after a plan.
        "Call id: call_7\nError:\nTool search_orders failed.\nNow let's retry: take care not to repeat previous errors! If you have retried several times, try a completely different approach.\n",
        "Error:\nUnknown order.\nNow let's retry: take care not to repeat previous errors! If you have retried several times, try a completely different approach.\n",
        "Now proceed and carry out this plan.",
        // SWE-agent: an observation with its shell prompt.
        "Order 4411 is pending.\n(Open file: /repo/orders.py)\n(Current directory: /repo)\nbash-$",
    ];
    for prompt in prompts {
        let mut h = H::default();
        let args = json!({"query": "status of order 4411"});
        let mut first = None;
        for i in 0..4 {
            let (c, _) = h.run("search_orders", args.clone(), "order 4411: pending", false);
            if !c.is_allow() && first.is_none() {
                first = Some(i + 1);
            }
            h.user(prompt, false);
        }
        assert_eq!(first, Some(3), "{prompt}");
    }
}

/// A result that differs only by a counter, an elapsed time and an opaque id is not a change.
#[test]
fn results_that_differ_only_by_volatile_tokens_are_the_same() {
    let mut h = H::default();
    let args = json!({"chat": "oc_5ad1", "text": "v2.3.1 released"});
    let mut first = None;
    for i in 1..=5 {
        let out = format!(
            "[exec #{i} exit=0 elapsed=0.0{i}s]\n{{\"message_id\": \"om_x100b8f{i}c1d6090618\", \"took_ms\": {}}}",
            100 + i
        );
        let (c, _) = h.run("send_message", args.clone(), &out, false);
        if !c.is_allow() && first.is_none() {
            first = Some(i);
        }
    }
    assert_eq!(first, Some(3));
}

/// Re-running the same failing test after a successful edit is a new attempt.
#[test]
fn a_successful_edit_between_identical_calls_is_progress() {
    let mut h = H::default();
    let test = json!({"command": "pytest -q tests/test_api.py"});
    for i in 0..6 {
        let (c, r) = h.run("bash", test.clone(), "10 passed", false);
        assert!(c.is_allow() && r.is_allow(), "{i}: {c:?} {r:?}");
        h.run(
            "Edit",
            json!({"file_path": "api.py", "old_string": format!("v{i}"), "new_string": "x"}),
            "The file api.py has been updated.",
            false,
        );
    }
}

/// Different edits all rejected with the same error at the same place are one outcome.
#[test]
fn different_calls_failing_the_same_way_are_the_same_outcome() {
    let mut h = H::default();
    let mut hit = None;
    for i in 0..4 {
        let (_, r) = h.run(
            "str_replace_editor",
            json!({"command": "str_replace", "path": "app.py", "old_str": format!("x{i}"), "new_str": "y"}),
            &format!("ERROR: No replacement was performed, old_str `x{i}` did not appear verbatim in app.py.\nFailed at app.py:42"),
            false,
        );
        if !r.is_allow() && hit.is_none() {
            hit = Some((i + 1, det(&r).map(str::to_owned)));
        }
    }
    assert_eq!(hit, Some((3, Some("same_outcome".to_owned()))));
}

/// A batch of keystrokes sent to a terminal, each its own call (a terminal agent's tool), the
/// screen coming back as the result of the last one and the others answered with a fixed note;
/// returns the verdict of each result.
fn keystrokes(h: &mut H, lines: &[&str], screen: &str) -> Vec<Verdict> {
    let ids: Vec<String> = lines
        .iter()
        .map(|l| {
            h.call(
                "bash_command",
                json!({"keystrokes": format!("{l}\n"), "duration": 0.5}),
            )
            .1
        })
        .collect();
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let out = if i + 1 == ids.len() {
                screen
            } else {
                "(one screen per batch)"
            };
            h.result(id, out, false)
        })
        .collect()
}

/// A terminal busy with a program that does not read its input shows what was typed and
/// nothing else: the commands did not run. Tries whose screens only echo their keystrokes are
/// the same failure, whatever was typed; the batch's other calls do not end the run.
#[test]
fn a_terminal_that_only_echoes_what_was_typed_is_the_same_failure_for_every_command() {
    let mut h = H::default();
    let batches: [&[&str]; 4] = [
        &["C-c", "pwd", "grep -n mask src/model.py"],
        &["C-c", "cd /work/repo", "sed -n '700,900p' src/model.py"],
        &["bash", "pwd", "sed -n '220,320p' src/model.py"],
        &["C-c", "echo READY"],
    ];
    let mut hit = None;
    for (b, lines) in batches.iter().enumerate() {
        // The screen shows the lines typed, some of the previous batch's too, and no prompt.
        let screen = format!("New Terminal Output:\n\n{}\n\n", lines.join("\n"));
        let verdicts = keystrokes(&mut h, lines, &screen);
        if hit.is_none()
            && let Some(v) = verdicts.iter().find(|v| !v.is_allow())
        {
            hit = Some((b + 1, det(v).map(str::to_owned)));
        }
    }
    assert_eq!(hit, Some((3, Some("same_outcome".to_owned()))));

    // The same keystrokes at a shell prompt ran: each screen shows the prompt and what the
    // commands printed.
    let mut h = H::default();
    for lines in batches {
        let screen = lines
            .iter()
            .map(|l| format!("root@box:/work/repo# {l}\n(output of {l})"))
            .collect::<Vec<_>>()
            .join("\n");
        let verdicts = keystrokes(&mut h, lines, &screen);
        assert!(verdicts.iter().all(Verdict::is_allow), "{screen}");
    }
}

/// A harness that shows each command before its output shows a silent command alone: a
/// command that changes files (`mkdir`, `cp`, `sed -i`) printing nothing is no echo.
#[test]
fn a_silent_change_shown_with_its_command_is_no_echo() {
    let mut h = H::default();
    for cmd in [
        "mkdir -p build/out",
        "cp config.example.yaml config.yaml",
        "sed -i 's/debug: true/debug: false/' config.yaml",
        "touch build/.stamp",
    ] {
        let (c, r) = h.bash(cmd, &format!("{cmd}\n"), false);
        assert!(c.is_allow() && r.is_allow(), "{cmd}: {r:?}");
    }
}

/// Typed lines are kept in snapshots: a session restored between two echoes still knows the
/// lines typed before, which the next echo shows.
#[test]
fn a_restored_session_still_knows_what_was_typed() {
    let mut h = H::default();
    let screen = |l: &str| format!("{l}\n");
    for l in ["ls src", "ls"] {
        let (_, r) = h.run("bash", json!({"command": l}), &screen(l), false);
        assert!(r.is_allow());
    }
    let snap = h.engine.snapshot_session(&h.session).expect("a snapshot");
    let engine = Engine::new(default_config());
    engine.restore_session(&h.session, &snap).expect("restored");
    h.engine = engine;
    // The screen still shows the line typed before the snapshot.
    let (_, r) = h.run("bash", json!({"command": "ls -la"}), "ls\nls -la\n", false);
    assert_eq!(det(&r), Some("same_outcome"));
}

/// Narration beside calls is never a text loop; the calls are judged.
#[test]
fn narration_beside_calls_is_not_a_text_loop() {
    let mut h = H::default();
    for i in 0..6 {
        let time_ms = h.tick();
        let v = h.engine.observe(&Event::Text(Text {
            session: "s",
            text: "Let me look at the next file.",
            chunk: false,
            end_of_turn: true,
            reasoning: false,
            narration: true,
            time_ms,
        }));
        assert!(v.is_allow());
        let (c, _) = h.run(
            "read_file",
            json!({"path": format!("src/m{i}.rs")}),
            "…",
            false,
        );
        assert!(c.is_allow());
    }
}

// --- per-tool control -------------------------------------------------------------------------

/// A legitimate repeating tool (a debugger's `next`) can be switched off, alone or by category.
#[test]
fn a_switched_off_tool_or_category_is_never_flagged() {
    for yaml in [
        "version: 1\ntools: { gdb_next: { enabled: false } }\n",
        "version: 1\ncategories: { debugger: { tools: [gdb_*], enabled: false } }\n",
    ] {
        let mut h = H::new(config(yaml));
        for _ in 0..8 {
            let (c, r) = h.run("gdb_next", json!({}), "at main.c:12", false);
            assert!(c.is_allow() && r.is_allow(), "{yaml}");
        }
        let mut flagged = false;
        for _ in 0..4 {
            flagged |= !h
                .run("bash", json!({"command": "ls"}), "a", false)
                .0
                .is_allow();
        }
        assert!(flagged, "other tools are still watched: {yaml}");
    }
}

/// A job poller exempt from the repeat detectors is not flagged for polling; it is for the
/// detectors it is not exempt from.
#[test]
fn an_exempt_detector_never_fires_on_that_tool() {
    let mut h = H::new(config(
        "version: 1\ntools: { job_status: { exempt: [exact_repeat, no_progress, fuzzy_repeat] } }\n",
    ));
    for _ in 0..8 {
        let (c, r) = h.run("job_status", json!({"id": 7}), "running", false);
        assert!(c.is_allow() && r.is_allow());
    }
    let mut h = H::new(config(
        "version: 1\ntools: { job_status: { exempt: [no_progress] } }\n",
    ));
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (c, r) = h.run("job_status", json!({"id": 7}), "running", false);
        seen.extend(det(&c).map(str::to_owned));
        seen.extend(det(&r).map(str::to_owned));
    }
    assert!(
        seen.iter().all(|d| d != "no_progress") && !seen.is_empty(),
        "{seen:?}"
    );
}

/// A `tools` entry places a tool in a category over every pattern (the default policy has
/// `grep` in `exploration`, threshold 4; moved to `shell`, threshold 3).
#[test]
fn a_tools_entry_moves_a_tool_to_another_category() {
    let mut h = H::new(config(
        "version: 1\ncategories:\n  exploration: { tools: [grep], detectors: { exact_repeat: { threshold: 5 }, no_progress: { enabled: false } } }\n  shell: { tools: [bash], detectors: { exact_repeat: { threshold: 3 } } }\ntools: { grep: { category: shell } }\n",
    ));
    let mut first = None;
    for i in 1..=5 {
        let (c, _) = h.run(
            "grep",
            json!({"pattern": "todo"}),
            "src/a.rs:3: todo",
            false,
        );
        if !c.is_allow() && first.is_none() {
            first = Some((i, c.rule.clone().unwrap_or_default()));
        }
    }
    let (at, rule) = first.expect("flagged");
    assert!(
        at <= 3 && rule.starts_with("categories.shell/"),
        "{at} {rule}"
    );
}

/// Codex patches files with `apply_patch` through its shell tool; the same failing test run
/// after each successful patch is a new attempt, not a repeat (until the same failure has
/// survived five patches: then it is `test_fix`'s edit-and-test loop).
#[test]
fn test_runs_after_shell_patches_are_progress() {
    let mut h = H::default();
    let test = json!({"command": ["bash", "-lc", "cargo test -q"], "workdir": "/repo"});
    for i in 0..4 {
        let (c, r) = h.run(
            "shell",
            test.clone(),
            "error[E0308]: mismatched types",
            true,
        );
        assert!(c.is_allow() && r.is_allow(), "{i}: {c:?} {r:?}");
        let patch = format!(
            "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/lib.rs\n-v{i}\n+x\n*** End Patch\nEOF"
        );
        h.run(
            "shell",
            json!({"command": ["bash", "-lc", patch], "workdir": "/repo"}),
            "Success. Updated the following files:\nM src/lib.rs",
            false,
        );
    }
}

/// Snapshots generated to be hostile: each over a bound of live sessions is refused whole,
/// naming the bound, and nothing of it is kept.
#[test]
fn hostile_snapshots_are_refused_and_never_stored() {
    let engine = Engine::new(default_config());
    for i in 0..3u64 {
        let args = json!({ "path": format!("notes/{i}.md") });
        engine.observe(&Event::Call(Call {
            session: "s",
            call_id: &format!("c{i}"),
            tool: "read",
            arguments: Arguments::Json(&args),
            time_ms: i * 1000,
        }));
    }
    let good = engine.snapshot_session("s").unwrap();
    let record = good["window"][0].clone();
    let armed = |message: Value, calls: Value| {
        json!({
            "tool": "read",
            "verdict": {
                "action": "block", "message": message, "detector": "exact_repeat",
                "rule": null, "count": 3, "calls": calls, "loop_start": null
            }
        })
    };
    type Edit<'a> = Box<dyn Fn(&mut Value) + 'a>;
    let hostile: Vec<(&str, Edit<'_>, &str)> = vec![
        (
            "a 50 MB message",
            Box::new(|s: &mut Value| {
                s["armed"] = armed(Value::String("x".repeat(50 << 20)), json!([]));
            }),
            "at most 65536",
        ),
        (
            "a million call references",
            Box::new(|s: &mut Value| {
                let calls = vec![json!({ "seq": 1, "call_id": "c0" }); 1_000_000];
                s["armed"] = armed(json!("Refused."), Value::Array(calls));
            }),
            "at most 1000",
        ),
        (
            "an oversized window",
            Box::new(move |s: &mut Value| {
                s["window"] = Value::Array(vec![record.clone(); 100_000]);
                s["seq"] = json!(200_000);
            }),
            "no policy keeps more than 1000",
        ),
        (
            "a 1 MB call id",
            Box::new(|s: &mut Value| {
                s["call_ids"][0]["id"] = Value::String("i".repeat(1 << 20));
            }),
            "at most 4096",
        ),
        (
            "a 1 MB group name",
            Box::new(|s: &mut Value| {
                s["group"] = json!({
                    "group": "g".repeat(1 << 20), "worker": "w", "loops": [], "workers": 1
                });
            }),
            "at most 65536",
        ),
        (
            "a million remembered files",
            Box::new(|s: &mut Value| {
                let file = json!({ "target": 1, "content": 2, "seq": 1 });
                s["files"] = Value::Array(vec![file; 1_000_000]);
            }),
            "at most 4",
        ),
        (
            "a file written by a call not yet made",
            Box::new(|s: &mut Value| {
                s["files"] = json!([{ "target": 1, "content": 2, "seq": 99 }]);
            }),
            "seen calls 1 to 3",
        ),
    ];
    for (what, make, bound) in hostile {
        let mut snap = good.clone();
        make(&mut snap);
        let target = Engine::new(default_config());
        let err = target.restore_session("h", &snap).unwrap_err().to_string();
        assert!(err.contains(bound), "{what}: {err}");
        assert!(target.snapshot_session("h").is_none(), "{what}: stored");
        // The whole-engine snapshot is refused the same way.
        let mut body = snap;
        if let Value::Object(fields) = &mut body {
            fields.remove("version");
        }
        let whole = json!({ "version": 1, "sessions": { "h": body }, "groups": null });
        let err = target.restore(&whole).unwrap_err().to_string();
        assert!(err.contains(bound), "{what}: {err}");
        assert_eq!(target.session_count(), 0, "{what}");
    }

    // Within the bounds, a window longer than this policy's keeps its newest calls, as a live
    // session does when its window shrinks.
    let mut longer = good.clone();
    let window = good["window"].as_array().unwrap().clone();
    let mut records = Vec::new();
    for _ in 0..200 {
        records.extend(window.iter().cloned());
    }
    longer["window"] = Value::Array(records);
    longer["seq"] = json!(10_000);
    let target = Engine::new(default_config());
    target.restore_session("h", &longer).unwrap();
    let kept = target.snapshot_session("h").unwrap()["window"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(kept, default_config().window_size);
}
