//! Tests of configuration tiers, the group (swarm) scope and snapshots, through the public API.

use std::path::Path;
use std::sync::Arc;

use loopguard_rules::{Policy, Settings};
use loopguard_store::format::VersionError;
use loopguard_store::{
    Availability, Backend, GroupStore, GroupTally, MemoryStore, StoreStatus, WorkerId,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::snapshot::SnapshotError;
use crate::{Action, Arguments, Call, Engine, Event, Text, ToolResult, UserMessage, Verdict};

fn policy(yaml: &str) -> Policy {
    let loaded = Policy::load_text(Path::new("t.yaml"), yaml.to_owned());
    assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
    loaded.policy.unwrap()
}

fn call(engine: &Engine, session: &str, id: &str, tool: &str, args: &Value, t: u64) -> Verdict {
    engine.observe(&Event::Call(Call {
        session,
        call_id: id,
        tool,
        arguments: Arguments::Json(args),
        time_ms: t,
    }))
}

fn result(engine: &Engine, session: &str, id: &str, output: &str, error: bool, t: u64) -> Verdict {
    engine.observe(&Event::Result(ToolResult {
        session,
        call_id: id,
        output,
        is_error: error,
        exit_code: None,
        time_ms: t,
    }))
}

fn threshold(engine: &Engine, session: &str) -> u32 {
    engine
        .with_session(session, |s| {
            s.rules().config().detectors.exact_repeat.threshold
        })
        .unwrap()
}

fn ladder(engine: &Engine, session: &str) -> String {
    engine
        .with_session(session, |s| s.rules().config().ladder.clone())
        .unwrap()
}

// --- tiers ------------------------------------------------------------------------------------

const TIERS: &str = r#"
version: 1
detectors:
  exact_repeat: { threshold: 3 }
overrides:
  - match: { model: "gpt-4o*" }
    detectors:
      exact_repeat: { threshold: 7 }
"#;

fn env_server() -> Settings {
    Settings::from_env(
        |k| match k {
            "LOOPGUARD_MAX_REPEATS" => Some("5".into()),
            "LOOPGUARD_MODE" => Some("break".into()),
            _ => None,
        },
        &["default", "break", "chance_then_break"],
    )
    .unwrap()
}

#[test]
fn session_over_overrides_over_server_over_policy() {
    let p = policy(TIERS);
    // Policy alone.
    let plain = Engine::builder(&p).build().unwrap();
    plain.set_session_settings("s", Settings::default());
    assert_eq!(threshold(&plain, "s"), 3);
    assert_eq!(ladder(&plain, "s"), "default");
    // Server settings (from the environment) over the policy.
    let server = Engine::builder(&p)
        .model("claude-3")
        .server_settings(env_server())
        .build()
        .unwrap();
    server.set_session_settings("s", Settings::default());
    assert_eq!(threshold(&server, "s"), 5);
    assert_eq!(ladder(&server, "s"), "break");
    // A matching override over the server settings, for the keys it sets only.
    let over = Engine::builder(&p)
        .model("gpt-4o-mini")
        .server_settings(env_server())
        .build()
        .unwrap();
    over.set_session_settings("s", Settings::default());
    assert_eq!(threshold(&over, "s"), 7);
    assert_eq!(ladder(&over, "s"), "break");
    // The session over everything.
    let session = Settings {
        max_repeats: Some(9),
        ..Settings::default()
    };
    over.set_session_settings("s", session.clone());
    assert_eq!(over.session_settings("s"), session);
    assert_eq!(threshold(&over, "s"), 9);
    assert_eq!(ladder(&over, "s"), "break", "unset keys fall through");
    // Unset: back to the tier below.
    over.set_session_settings("s", Settings::default());
    assert_eq!(over.session_settings("s"), Settings::default());
    assert_eq!(threshold(&over, "s"), 7);
    // Other sessions never see a session's settings.
    over.set_session_settings("other", Settings::default());
    assert_eq!(threshold(&over, "other"), 7);
}

/// One engine serves every model: each session is resolved for its own (backend, model), the
/// session tier stays on top, and the window and counters survive a change of model.
#[test]
fn one_engine_resolves_each_sessions_model_over_the_tiers() {
    let p = policy(TIERS);
    let engine = Engine::builder(&p)
        .server_settings(env_server())
        .build()
        .unwrap();
    engine.set_session_target("mini", None, Some("gpt-4o-mini"));
    engine.set_session_target("claude", None, Some("claude-3"));
    assert_eq!(threshold(&engine, "mini"), 7);
    assert_eq!(threshold(&engine, "claude"), 5);
    assert_eq!(ladder(&engine, "mini"), "break");
    assert_eq!(
        engine.session_target("mini").model.as_deref(),
        Some("gpt-4o-mini")
    );
    // Models matching the same overrides share one compiled rule set.
    engine.set_session_target("big", None, Some("gpt-4o-2024"));
    assert!(Arc::ptr_eq(
        &engine.session_rules("mini"),
        &engine.session_rules("big")
    ));
    // The session tier over the session's target.
    let nine = Settings {
        max_repeats: Some(9),
        ..Settings::default()
    };
    engine.set_session_settings("mini", nine.clone());
    assert_eq!(threshold(&engine, "mini"), 9);
    engine.set_session_settings("mini", Settings::default());
    assert_eq!(threshold(&engine, "mini"), 7);
    // A change of model keeps the window: three identical calls under gpt-4o's threshold of 7
    // (another detector off), then the 4th under the policy's 3 is flagged.
    let p2 = policy(&TIERS.replace(
        "exact_repeat: { threshold: 3 }",
        "exact_repeat: { threshold: 3 }\n  fuzzy_repeat: { enabled: false }",
    ));
    let switching = Engine::builder(&p2).model("gpt-4o").build().unwrap();
    let args = json!({"command": "make"});
    for i in 0..3 {
        let v = call(
            &switching,
            "switch",
            &format!("c{i}"),
            "bash",
            &args,
            i * 1000,
        );
        assert!(v.is_allow(), "call {i}: {v:?}");
    }
    switching.set_session_target("switch", None, Some("claude-3"));
    assert_eq!(threshold(&switching, "switch"), 3);
    let v = call(&switching, "switch", "c3", "bash", &args, 5000);
    assert_eq!(v.detector.as_deref(), Some("exact_repeat"), "{v:?}");
    assert_eq!(v.count, 4, "the window survived the change of model: {v:?}");
    // The target travels with the session's snapshot.
    let snap = engine.snapshot_session("mini").unwrap();
    assert_eq!(snap["target"]["model"], "gpt-4o-mini");
    let other = Engine::builder(&p).build().unwrap();
    other.restore_session("mini", &snap).unwrap();
    assert_eq!(threshold(&other, "mini"), 7);
}

/// A client naming many models makes the engine compile one rule set per distinct list of
/// matching overrides, not one per name.
#[test]
fn many_model_names_compile_one_rule_set_per_matching_override_list() {
    let p = policy(TIERS);
    let engine = Engine::builder(&p).build().unwrap();
    for i in 0..500 {
        engine.set_session_target(&format!("s{i}"), None, Some(&format!("model-{i}")));
        engine.set_session_target(&format!("g{i}"), None, Some(&format!("gpt-4o-{i}")));
    }
    assert!(Arc::ptr_eq(
        &engine.session_rules("s1"),
        &engine.session_rules("s499")
    ));
    assert!(Arc::ptr_eq(
        &engine.session_rules("g1"),
        &engine.session_rules("g499")
    ));
    assert!(!Arc::ptr_eq(
        &engine.session_rules("s1"),
        &engine.session_rules("g1")
    ));
}

#[test]
fn session_settings_change_verdicts_and_keep_the_window() {
    let engine = Engine::builder(&policy(TIERS)).build().unwrap();
    let args = json!({"q": "same"});
    assert!(call(&engine, "s", "c1", "lookup", &args, 1).is_allow());
    assert!(call(&engine, "s", "c2", "lookup", &args, 2).is_allow());
    engine.set_session_settings(
        "s",
        Settings {
            max_repeats: Some(5),
            ..Settings::default()
        },
    );
    assert!(call(&engine, "s", "c3", "lookup", &args, 3).is_allow());
    // Unset again: the window kept its calls, so this is the 4th of a threshold of 3.
    engine.set_session_settings("s", Settings::default());
    let v = call(&engine, "s", "c4", "lookup", &args, 4);
    assert_eq!(v.action, Action::Warn);
    assert_eq!(v.count, 4);
    // A mode the policy does not define is ignored; max_repeats stays within 2..=1000.
    engine.set_session_settings(
        "s",
        Settings {
            mode: Some("no-such-ladder".into()),
            max_repeats: Some(0),
            ..Settings::default()
        },
    );
    assert_eq!(
        engine.session_settings("s"),
        Settings {
            max_repeats: Some(2),
            ..Settings::default()
        }
    );
}

#[test]
fn a_window_resized_by_settings_keeps_its_newest_calls() {
    let p = policy(
        "version: 1\nwindow: { size: 4 }\ndetectors:\n  cycle: { max_period: 2 }\n  exact_repeat: { threshold: 3 }\n  fuzzy_repeat: { enabled: false }\n",
    );
    let engine = Engine::builder(&p).build().unwrap();
    let (x, y) = (json!({"q": "x"}), json!({"q": "y"}));
    let mut t = 0;
    let mut next = |args: &Value| {
        t += 1;
        call(&engine, "s", &format!("c{t}"), "lookup", args, t)
    };
    assert!(next(&x).is_allow());
    assert!(next(&y).is_allow());
    assert!(next(&x).is_allow());
    // max_repeats 6 grows the window to 6: the three calls stay in it.
    engine.set_session_settings(
        "s",
        Settings {
            max_repeats: Some(6),
            ..Settings::default()
        },
    );
    let window = |e: &Engine| {
        e.with_session("s", |s| s.rules().config().window_size)
            .unwrap()
    };
    assert_eq!(window(&engine), 6);
    for _ in 0..3 {
        let v = next(&x);
        assert!(v.is_allow(), "5 of 6 at most: {v:?}");
    }
    // Back to a window of 4, which keeps the newest calls (all `x`): the next `x` is the 4th
    // the window holds, flagged at once.
    engine.set_session_settings("s", Settings::default());
    assert_eq!(window(&engine), 4);
    let v = next(&x);
    assert_eq!(v.action, Action::Warn, "{v:?}");
    assert_eq!(v.count, 4);
}

#[test]
fn sessions_with_equal_settings_share_compiled_rules() {
    let engine = Engine::builder(&policy(TIERS)).build().unwrap();
    let s = Settings {
        ttl_seconds: Some(60),
        ..Settings::default()
    };
    engine.set_session_settings("a", s.clone());
    engine.set_session_settings("b", s);
    let a = engine.with_session("a", |s| Arc::clone(s.rules())).unwrap();
    let b = engine.with_session("b", |s| Arc::clone(s.rules())).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, engine.rules()));
    engine.observe(&Event::Reset {
        session: "a",
        time_ms: 5,
    });
    assert_eq!(
        engine.session_settings("a").ttl_seconds,
        Some(60),
        "a reset keeps the settings"
    );
}

#[test]
fn a_disabled_session_allows_everything_and_keeps_nothing() {
    let engine = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap();
    engine.set_session_settings(
        "off",
        Settings {
            enabled: Some(false),
            ..Settings::default()
        },
    );
    engine.join_group("off", "swarm", "w1");
    let before = engine.with_session("off", |s| s.memory_bytes()).unwrap();
    let args = json!({"command": "make"});
    for i in 0..20 {
        let id = format!("c{i}");
        assert!(call(&engine, "off", &id, "bash", &args, i).is_allow());
        assert!(result(&engine, "off", &id, "error", true, i).is_allow());
    }
    let (calls, after) = engine
        .with_session("off", |s| (s.calls_seen(), s.memory_bytes()))
        .unwrap();
    assert_eq!(calls, 0, "a disabled session records nothing");
    assert_eq!(after, before, "and allocates nothing");
    assert_eq!(
        engine.store().tally("swarm", 0).count,
        0,
        "nor counts for its group"
    );
    // Other sessions are unaffected.
    for i in 0..3 {
        let v = call(&engine, "on", &format!("c{i}"), "bash", &args, i);
        assert_eq!(v.is_allow(), i < 2);
    }
}

// --- group scope ------------------------------------------------------------------------------

/// Session detectors off, so that only the group detector speaks.
const SWARM: &str = r#"
version: 1
detectors:
  exact_repeat: { enabled: false }
  fuzzy_repeat: { enabled: false }
  cycle: { enabled: false }
  interleaved: { enabled: false }
group: { threshold: 4, min_workers: 2 }
"#;

fn install() -> Value {
    json!({"package": "left-pad@9.9.9"})
}

#[test]
fn a_group_loop_needs_the_threshold_and_two_workers() {
    let engine = Engine::builder(&policy(SWARM)).build().unwrap();
    engine.join_group("a", "swarm", "worker-a");
    engine.join_group("b", "swarm", "worker-b");
    let args = install();
    let mut t = 0;
    let mut next = |session: &str| {
        t += 1;
        call(
            &engine,
            session,
            &format!("{session}{t}"),
            "install",
            &args,
            t,
        )
    };
    assert!(next("a").is_allow());
    assert!(next("b").is_allow());
    assert!(next("a").is_allow());
    let v = next("b");
    assert_eq!(v.action, Action::Warn, "{v:?}");
    assert_eq!(v.detector.as_deref(), Some("group_loop"));
    assert_eq!(v.count, 4);
    assert_eq!(v.rule.as_deref(), Some("ladders.group[0]"));
    assert!(
        v.message.contains("whole swarm") && v.message.contains("2 workers"),
        "{}",
        v.message
    );
    // This worker's own calls of the loop.
    assert_eq!(v.calls.len(), 2);
    // Every worker that continues is told, each climbing the group ladder on its own.
    assert_eq!(next("a").action, Action::Warn);
    assert_eq!(next("b").action, Action::Warn);
    assert_eq!(next("a").action, Action::Warn);
    let refused = next("b");
    assert_eq!(refused.action, Action::Block);
    assert!(refused.message.contains("swarm"), "{}", refused.message);
}

#[test]
fn one_worker_alone_never_makes_a_group_loop() {
    let engine = Engine::builder(&policy(SWARM)).build().unwrap();
    // Two sessions of one worker are one worker.
    engine.join_group("a", "swarm", "worker-a");
    engine.join_group("a2", "swarm", "worker-a");
    let args = install();
    for t in 0..40 {
        let s = if t % 2 == 0 { "a" } else { "a2" };
        assert!(call(&engine, s, &format!("c{t}"), "install", &args, t).is_allow());
    }
    assert_eq!(engine.store().tally("swarm", 0).workers, 0);
    // Sessions outside the group do not count for it.
    let loner = Engine::builder(&policy(SWARM)).build().unwrap();
    loner.join_group("a", "swarm", "worker-a");
    for t in 0..10 {
        assert!(call(&loner, "a", &format!("a{t}"), "install", &args, t).is_allow());
        assert!(call(&loner, "x", &format!("x{t}"), "install", &args, t).is_allow());
    }
}

#[test]
fn clearing_a_group_starts_it_over() {
    let engine = Engine::builder(&policy(SWARM)).build().unwrap();
    engine.join_group("a", "swarm", "worker-a");
    engine.join_group("b", "swarm", "worker-b");
    let args = install();
    let mut t = 0;
    let mut next = |session: &str| {
        t += 1;
        call(
            &engine,
            session,
            &format!("{session}{t}"),
            "install",
            &args,
            t,
        )
    };
    for s in ["a", "b", "a"] {
        assert!(next(s).is_allow());
    }
    assert_eq!(next("b").action, Action::Warn);
    assert_eq!(next("b").action, Action::Warn);
    engine.clear_group("swarm");
    for s in ["a", "b", "a"] {
        assert!(next(s).is_allow(), "the counts start over");
    }
    let again = next("b");
    assert_eq!(again.action, Action::Warn, "and so do the workers' ladders");
    assert_eq!(again.count, 4);
    // Leaving the group stops counting.
    engine.leave_group("a");
    assert!(next("a").is_allow());
    let status = engine.store_status();
    assert_eq!(status.backend, Backend::Memory);
    assert_eq!(status.errors, 0);
}

#[test]
fn the_default_policy_warns_the_swarm_at_ten_calls() {
    let engine = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap();
    let args = json!({"command": "npm install left-pad@9.9.9"});
    // Five workers each run the failing install twice: no session loops on its own.
    let mut t = 0;
    let mut last = Verdict::allow();
    for round in 0..2 {
        for w in 1..=5 {
            let session = format!("w{w}");
            engine.join_group(&session, "swarm", &session);
            t += 1000;
            let id = format!("c{round}");
            last = call(&engine, &session, &id, "bash", &args, t);
            if t < 10_000 {
                assert!(last.is_allow(), "call {t}: {last:?}");
            }
            result(&engine, &session, &id, "npm error notarget", true, t + 1);
        }
    }
    assert_eq!(last.detector.as_deref(), Some("group_loop"));
    assert_eq!(last.action, Action::Warn);
    assert!(
        last.message
            .contains("5 workers have made this bash call 10 times"),
        "{}",
        last.message
    );
}

#[test]
fn a_disabled_group_section_counts_nothing() {
    let p = policy(&SWARM.replace(
        "group: { threshold: 4, min_workers: 2 }",
        "group: { enabled: false }",
    ));
    let engine = Engine::builder(&p).build().unwrap();
    engine.join_group("a", "g", "a");
    engine.join_group("b", "g", "b");
    for t in 0..20 {
        let s = if t % 2 == 0 { "a" } else { "b" };
        assert!(call(&engine, s, &format!("c{t}"), "install", &install(), t).is_allow());
    }
    assert_eq!(engine.store_status().groups, 0);
}

/// A store that cannot vouch for anything (Redis down, failing closed).
#[derive(Debug, Default)]
struct Down(MemoryStore);

impl GroupStore for Down {
    fn record(&self, group: &str, worker: WorkerId, fp: u64, at_ms: u64) -> GroupTally {
        GroupTally {
            availability: Availability::Unavailable,
            ..self.0.record(group, worker, fp, at_ms)
        }
    }
    fn tally(&self, group: &str, fp: u64) -> GroupTally {
        self.0.tally(group, fp)
    }
    fn clear_group(&self, group: &str) {
        self.0.clear_group(group);
    }
    fn status(&self) -> StoreStatus {
        self.0.status()
    }
}

#[test]
fn an_unavailable_store_that_fails_closed_refuses_group_calls() {
    let engine = Engine::builder(&policy(SWARM))
        .store(Arc::new(Down::default()))
        .build()
        .unwrap();
    engine.join_group("a", "swarm", "worker-a");
    let v = call(&engine, "a", "c1", "install", &install(), 1);
    assert_eq!(v.action, Action::Block);
    assert_eq!(v.detector.as_deref(), Some("group_store"));
    assert!(v.message.contains("unreachable"), "{}", v.message);
    assert_eq!(v.loop_start.map(|c| c.call_id).as_deref(), Some("c1"));
    // Sessions outside a group do not depend on the store.
    assert!(call(&engine, "solo", "c1", "install", &install(), 1).is_allow());
}

#[test]
fn a_memory_store_given_to_the_builder_counts_the_group() {
    let store = Arc::new(MemoryStore::default());
    let engine = Engine::builder(&policy(SWARM))
        .memory_store(Arc::clone(&store))
        .build()
        .unwrap();
    engine.join_group("a", "swarm", "worker-a");
    call(&engine, "a", "c1", "install", &install(), 1);
    assert_eq!(store.status().groups, 1);
}

// --- snapshots --------------------------------------------------------------------------------

#[test]
fn a_session_snapshot_round_trips_through_json() {
    let engine = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap();
    engine.set_session_settings(
        "s",
        Settings {
            max_repeats: Some(4),
            ..Settings::default()
        },
    );
    engine.join_group("s", "swarm", "w1");
    let args = json!({"command": "cargo build"});
    for i in 0..3 {
        let id = format!("c{i}");
        call(&engine, "s", &id, "bash", &args, i * 10);
        result(&engine, "s", &id, "error[E0425]", true, i * 10 + 1);
    }
    let snap = engine.snapshot_session("s").unwrap();
    assert_eq!(snap["version"], 3);
    assert_eq!(snap["settings"]["max_repeats"], 4);
    assert_eq!(snap["group"]["worker"], "w1");
    let text = serde_json::to_string(&snap).unwrap();
    let fresh = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap();
    fresh
        .restore_session("s", &serde_json::from_str(&text).unwrap())
        .unwrap();
    assert_eq!(fresh.snapshot_session("s").unwrap(), snap);
    assert_eq!(fresh.session_settings("s").max_repeats, Some(4));
    assert_eq!(
        fresh.with_session("s", |s| s
            .group()
            .map(|(g, w)| (g.to_owned(), w.to_owned()))),
        Some(Some(("swarm".to_owned(), "w1".to_owned())))
    );
    assert!(engine.snapshot_session("nobody").is_none());
}

/// A session restored between turns that a framework rejected the same way keeps its count
/// of them: the next rejected turn is flagged where it would have been without the restore.
#[test]
fn a_restored_session_keeps_its_count_of_rejected_turns() {
    let policy = Policy::builtin_default().policy.unwrap();
    // Rounds of a turn without a call and the same rejection; a restore after `cut` rounds.
    let first_flag = |cut: Option<usize>, rejection: &str| {
        let mut engine = Engine::builder(&policy).build().unwrap();
        for round in 0..6u64 {
            if cut == Some(round as usize) {
                let snap = engine.snapshot_session("s").unwrap();
                let text = serde_json::to_string(&snap).unwrap();
                engine = Engine::builder(&policy).build().unwrap();
                engine
                    .restore_session("s", &serde_json::from_str(&text).unwrap())
                    .unwrap();
            }
            let v = engine.observe(&Event::Text(Text {
                session: "s",
                text: &format!(
                    "Here is the {} try: a manifest.",
                    ["first", "second", "third", "fourth", "fifth", "sixth"][round as usize]
                ),
                chunk: false,
                end_of_turn: true,
                reasoning: false,
                narration: false,
                time_ms: round * 1_000,
            }));
            if !v.is_allow() {
                return Some(round);
            }
            engine.observe(&Event::User(UserMessage {
                session: "s",
                text: rejection,
                injected: false,
                time_ms: round * 1_000 + 500,
            }));
        }
        None
    };
    // A rejection the policy knows for the host's, and a check's short output that is the
    // host's from its second sending on (the turn the first one ended counts again).
    for rejection in [
        "exitcode: 1 (execution failed)\nCode output: \nunknown language yaml",
        "find: src: No such file or directory",
    ] {
        let straight = first_flag(None, rejection);
        assert_eq!(straight, Some(2), "the 3rd rejected turn: {rejection}");
        for cut in 1..4 {
            assert_eq!(
                first_flag(Some(cut), rejection),
                straight,
                "restored after {cut} rounds: {rejection}"
            );
        }
    }
}

#[test]
fn snapshot_versions_and_corruption_are_refused_clearly() {
    let engine = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap();
    call(&engine, "s", "c1", "bash", &json!({"command": "ls"}), 1);
    let good = engine.snapshot_session("s").unwrap();
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        let fresh = Engine::builder(&Policy::builtin_default().policy.unwrap())
            .build()
            .unwrap();
        let err = fresh.restore_session("s", &v).unwrap_err();
        assert!(
            fresh.with_session("s", |_| ()).is_none(),
            "a refused snapshot restores nothing"
        );
        err
    };
    let newer = with(&|v| v["version"] = json!(4));
    assert!(matches!(
        newer,
        SnapshotError::Version(VersionError::TooNew {
            found: 4,
            supported: 3,
            ..
        })
    ));
    assert!(
        newer.to_string().contains("newer than this build reads"),
        "{newer}"
    );
    let older = with(&|v| v["version"] = json!(0));
    assert!(matches!(
        older,
        SnapshotError::Version(VersionError::TooOld {
            found: 0,
            oldest: 1,
            ..
        })
    ));
    assert!(older.to_string().contains("too old to migrate"), "{older}");
    let missing = with(&|v| {
        v.as_object_mut().unwrap().remove("version");
    });
    assert!(matches!(
        missing,
        SnapshotError::Version(VersionError::Missing { .. })
    ));
    let unknown = with(&|v| v["surprise"] = json!(true));
    assert!(
        unknown.to_string().contains("unknown field `surprise`"),
        "{unknown}"
    );
    let hex = with(&|v| v["window"][0]["exact"] = json!("xyz"));
    assert!(hex.to_string().contains("16 hex digits"), "{hex}");
    let seq = with(&|v| v["seq"] = json!(0));
    assert!(
        matches!(&seq, SnapshotError::Invalid { session, .. } if session == "s"),
        "{seq}"
    );
    assert!(seq.to_string().contains("window holds 1 calls"), "{seq}");
    let mode = with(&|v| v["settings"] = json!({"mode": "nope"}));
    assert!(mode.to_string().contains("ladder `nope`"), "{mode}");
    let not_object = Engine::builder(&Policy::builtin_default().policy.unwrap())
        .build()
        .unwrap()
        .restore_session("s", &json!([1, 2]))
        .unwrap_err();
    assert!(matches!(
        not_object,
        SnapshotError::Version(VersionError::NotAnObject { .. })
    ));
    assert_eq!(
        not_object.to_string(),
        "malformed snapshot: expected a JSON object with a `version` field"
    );
    assert!(crate::snapshot::SNAPSHOT.is_consistent());
}

// Regression: loops keyed by a tool id (unknown_tool, error_cascade) started over after a restore
// into an engine that had numbered its tools in another order.
#[test]
fn loop_counters_of_a_tool_survive_a_restore_into_an_engine_with_other_tool_ids() {
    let p =
        policy("version: 1\ndetectors:\n  unknown_tool: { threshold: 2, known_tools: [bash] }\n");
    let args = json!({"x": 1});
    let first = Engine::builder(&p).build().unwrap();
    assert!(call(&first, "s", "c1", "frobnicate", &args, 1).is_allow());
    assert_eq!(
        call(&first, "s", "c2", "frobnicate", &args, 2).action,
        Action::Warn
    );
    let snap = first.snapshot_session("s").unwrap();
    let second = Engine::builder(&p).build().unwrap();
    call(&second, "other", "o1", "bash", &args, 0);
    call(&second, "other", "o2", "grep", &args, 0);
    second.restore_session("s", &snap).unwrap();
    let v = call(&second, "s", "c3", "frobnicate", &args, 3);
    assert_eq!(v.detector.as_deref(), Some("unknown_tool"));
    assert_eq!(
        v.action,
        Action::Block,
        "the loop's second detection: {v:?}"
    );
}

#[test]
fn an_engine_snapshot_carries_sessions_and_group_counts() {
    let p = policy(SWARM);
    let engine = Engine::builder(&p).build().unwrap();
    engine.join_group("a", "swarm", "worker-a");
    engine.join_group("b", "swarm", "worker-b");
    let args = install();
    for (t, s) in ["a", "b", "a"].into_iter().enumerate() {
        assert!(call(&engine, s, &format!("c{t}"), "install", &args, t as u64).is_allow());
    }
    let snap = engine.snapshot();
    let fresh = Engine::builder(&p).build().unwrap();
    assert_eq!(fresh.restore(&snap).unwrap(), 2);
    let v = call(&fresh, "b", "c9", "install", &args, 9);
    assert_eq!(v.detector.as_deref(), Some("group_loop"), "{v:?}");
    // A corrupted group part is refused, and restores no session either.
    let mut bad = snap.clone();
    bad["groups"]["groups"][0]["fingerprints"][0]["count"] = json!(0);
    let other = Engine::builder(&p).build().unwrap();
    let err = other.restore(&bad).unwrap_err();
    assert!(err.to_string().contains("count is 0"), "{err}");
    assert_eq!(other.session_count(), 0);
    // An engine whose counters live in a shared store cannot take them.
    let shared = Engine::builder(&p)
        .store(Arc::new(MemoryStore::default()))
        .build()
        .unwrap();
    assert!(matches!(
        shared.restore(&snap),
        Err(SnapshotError::GroupStoreNotInMemory { groups: 1 })
    ));
}

/// One generated event of a session.
#[derive(Clone, Debug)]
enum Ev {
    Call {
        tool: usize,
        arg: usize,
    },
    /// The result of the n-th most recent call.
    Result {
        back: usize,
        output: usize,
        error: bool,
    },
    Text {
        text: usize,
    },
    User {
        text: usize,
    },
    Reset,
    /// The session's settings change (max_repeats; `None`: unset).
    Settings {
        max_repeats: Option<u32>,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (0..TOOLS.len(), 0..ARGS).prop_map(|(tool, arg)| Ev::Call { tool, arg }),
        4 => (0..3usize, 0..3usize, any::<bool>())
            .prop_map(|(back, output, error)| Ev::Result { back, output, error }),
        2 => (0..3usize).prop_map(|text| Ev::Text { text }),
        1 => (0..USERS.len()).prop_map(|text| Ev::User { text }),
        1 => Just(Ev::Reset),
        1 => proptest::option::of(2..6u32).prop_map(|max_repeats| Ev::Settings { max_repeats }),
    ]
}

const TOOLS: [&str; 4] = ["bash", "read_file", "frobnicate", "write_file"];
/// Argument sets: builds, and literal writes of two contents to one file.
const ARGS: usize = 5;
/// What a person (or, the last, a framework rejecting a turn) says.
const USERS: [&str; 4] = [
    "Let me think about this once more before I act.",
    "I will try the same thing again.",
    "Run it 3 times please.",
    "exitcode: 1 (execution failed)\nCode output: \nunknown language unknown",
];
const TEXTS: [&str; 3] = [
    "Let me think about this once more before I act.",
    "I will try the same thing again.",
    "Run it 3 times please.",
];
const OUTPUTS: [&str; 3] = [
    "error: not found",
    "ok",
    "bash: frobnicate: command not found",
];

/// Feeds events to `engine` as workers "a" and "b" of one group, alternating by event index;
/// returns the verdicts. `from` numbers the events (ids and times continue across a restore).
fn feed(engine: &Engine, events: &[(usize, Ev)], calls: &mut [Vec<String>; 2]) -> Vec<Verdict> {
    let mut args: Vec<Value> = (0..3)
        .map(|i| json!({"command": format!("make target{i}"), "path": format!("src/{i}.rs")}))
        .collect();
    for content in ["one", "two"] {
        args.push(json!({"command": format!("echo {content} > f.txt"), "path": "f.txt", "content": content}));
    }
    let mut out = Vec::new();
    for (n, e) in events {
        let w = n % 2;
        let session = ["a", "b"][w];
        let t = 1_000 * *n as u64;
        let v = match e {
            Ev::Call { tool, arg } => {
                let id = format!("call{n}");
                calls[w].push(id.clone());
                call(engine, session, &id, TOOLS[*tool], &args[*arg], t)
            }
            Ev::Result {
                back,
                output,
                error,
            } => {
                let ids = &calls[w];
                match ids.len().checked_sub(back + 1).and_then(|i| ids.get(i)) {
                    Some(id) => result(engine, session, id, OUTPUTS[*output], *error, t),
                    None => result(engine, session, "stray", OUTPUTS[*output], *error, t),
                }
            }
            Ev::Text { text } => engine.observe(&Event::Text(Text {
                session,
                text: TEXTS[*text],
                chunk: false,
                end_of_turn: true,
                reasoning: false,
                narration: false,
                time_ms: t,
            })),
            Ev::User { text } => engine.observe(&Event::User(UserMessage {
                session,
                text: USERS[*text],
                injected: false,
                time_ms: t,
            })),
            Ev::Reset => engine.observe(&Event::Reset {
                session,
                time_ms: t,
            }),
            Ev::Settings { max_repeats } => {
                let settings = Settings {
                    max_repeats: *max_repeats,
                    ..Settings::default()
                };
                engine.set_session_settings(session, settings);
                Verdict::allow()
            }
        };
        out.push(v);
    }
    out
}

const PROP_POLICY: &str = r#"
version: 1
window: { size: 10 }
time: { ttl_seconds: 20 }
detectors:
  exact_repeat: { threshold: 3 }
  fuzzy_repeat: { threshold: 4 }
  unknown_tool: { threshold: 2, known_tools: [bash, read_file] }
  monologue: { threshold: 3 }
  text_repeat: { threshold: 2 }
group: { threshold: 5, min_workers: 2 }
"#;

fn prop_engine(p: &Policy) -> Engine {
    let e = Engine::builder(p).build().unwrap();
    e.join_group("a", "swarm", "a");
    e.join_group("b", "swarm", "b");
    e.set_session_settings(
        "b",
        Settings {
            max_repeats: Some(4),
            ..Settings::default()
        },
    );
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn snapshot_and_restore_give_the_same_verdicts_as_no_interruption(
        events in proptest::collection::vec(ev(), 1..80),
        cut in any::<prop::sample::Index>(),
        whole_engine in any::<bool>(),
    ) {
        let p = policy(PROP_POLICY);
        let events: Vec<(usize, Ev)> = events.into_iter().enumerate().collect();
        let cut = cut.index(events.len() + 1);
        let (before, after) = events.split_at(cut);

        let straight = prop_engine(&p);
        let mut calls = [Vec::new(), Vec::new()];
        let mut expected = feed(&straight, before, &mut calls);
        let expected_after = feed(&straight, after, &mut calls);
        expected.extend(expected_after.iter().cloned());

        let first = prop_engine(&p);
        let mut calls = [Vec::new(), Vec::new()];
        let got_before = feed(&first, before, &mut calls);
        prop_assert_eq!(&got_before[..], &expected[..cut]);
        // Through JSON text, as a host would store it.
        let resumed = Engine::builder(&p).build().unwrap();
        if whole_engine {
            let text = serde_json::to_string(&first.snapshot()).unwrap();
            resumed.restore(&serde_json::from_str(&text).unwrap()).unwrap();
        } else {
            for id in ["a", "b"] {
                let text = serde_json::to_string(&first.snapshot_session(id).unwrap()).unwrap();
                resumed.restore_session(id, &serde_json::from_str(&text).unwrap()).unwrap();
            }
            // The group counts live in the store, which a session snapshot leaves out.
            let groups = first.snapshot()["groups"].clone();
            resumed.restore(&json!({"version": 1, "sessions": {}, "groups": groups})).unwrap();
        }
        let got_after = feed(&resumed, after, &mut calls);
        prop_assert_eq!(&got_after[..], &expected_after[..]);
        for id in ["a", "b"] {
            prop_assert_eq!(resumed.snapshot_session(id), straight.snapshot_session(id));
        }
    }
}
