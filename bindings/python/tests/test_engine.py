"""The engine from Python: events, verdicts, policies, settings, groups, snapshots, threads."""

from __future__ import annotations

import json
import threading

import pytest

import loopguard
from loopguard import Action

from conftest import run_loopctl


def loop(engine, session, n, tool="read_file", args=None, output="same text"):
    """n identical calls, each answered with the same output; every verdict, in order."""
    verdicts = []
    for i in range(n):
        verdicts.append(engine.call(session, f"c{i}", tool, args or {"path": "a.txt"}))
        verdicts.append(engine.result(session, f"c{i}", output))
    return verdicts


def test_a_loop_is_warned_then_blocked_then_terminated():
    engine = loopguard.Engine()
    actions = [v.action for v in loop(engine, "s", 6)]
    assert Action.WARN in actions
    assert actions.index(Action.WARN) < actions.index(Action.BLOCK) < actions.index(Action.TERMINATE)
    blocked = next(v for v in loop(loopguard.Engine(), "t", 4) if v.action == Action.BLOCK)
    assert blocked.detector == "exact_repeat"
    assert blocked.calls == ["c0", "c1", "c2", "c3"]
    assert blocked.loop_start == "c0"
    assert blocked.count == 4
    assert blocked.rule and blocked.message
    assert not blocked.is_allow


def test_healthy_work_is_never_touched():
    engine = loopguard.Engine()
    for i in range(30):
        v = engine.call("s", f"c{i}", "read_file", {"path": f"src/file_{i}.rs"})
        assert v.is_allow and v.action == "allow" and v.message == ""
        assert engine.result("s", f"c{i}", f"contents of file {i}: fn f{i}() {{}}").is_allow


def test_arguments_as_text_and_as_dict_are_the_same_call():
    a, b = loopguard.Engine(), loopguard.Engine()
    args = {"path": "src/a.rs", "offset": 10, "limit": 2.5, "flags": [True, None], "n": 2**70}
    va = [a.call("s", f"c{i}", "read_file", args).action for i in range(5)]
    vb = [b.call("s", f"c{i}", "read_file", json.dumps(args)).action for i in range(5)]
    assert va == vb
    assert Action.BLOCK in va


def test_a_dict_and_its_json_text_are_one_call_in_a_session():
    # Alternating the two forms of each argument set must still be a repeat of one call;
    # strings that need escaping, nested lists and tuples, floats, big ints and keys that are
    # not strings included.
    tricky = [
        {"command": 'echo "quoted" \\ back\ttab\nline\x01\x1f é 😀', "cwd": "/tmp"},
        {"items": [1, -2, 2.5, 1e300, float("nan"), 2**70, (True, None)], "nested": {"a": {"b": []}}},
        {1: "one", "2": "two"},
    ]
    for args in tricky:
        engine = loopguard.Engine()
        forms = [args, json.dumps(args, allow_nan=True).replace("NaN", "null")]
        actions = [engine.call("s", f"c{i}", "deploy", forms[i % 2]).action for i in range(4)]
        assert actions[0] == Action.ALLOW and Action.BLOCK in actions, (args, actions)
    # Arguments that differ in one escaped character are different calls.
    engine = loopguard.Engine()
    actions = [
        engine.call("s", f"c{i}", "deploy", {"command": f"echo \x01{i}\n"}).action for i in range(6)
    ]
    assert all(a == Action.ALLOW for a in actions)


def test_sessions_are_independent():
    engine = loopguard.Engine()
    loop(engine, "looping", 5)
    assert engine.call("other", "c0", "read_file", {"path": "a.txt"}).is_allow
    assert set(engine.session_ids()) == {"looping", "other"}


def test_bad_arguments_raise():
    engine = loopguard.Engine()
    with pytest.raises(TypeError):
        engine.call("s", "c0", "t", {"x": object()})
    deep = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError):
        engine.call("s", "c0", "t", {"x": deep})


def test_policy_errors_carry_the_report_validate_prints(tmp_path, loopctl):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\ndetectors:\n  exact_repeat:\n    treshold: 3\n")
    with pytest.raises(loopguard.PolicyError) as caught:
        loopguard.Policy.load(bad)
    message = str(caught.value)
    assert f"{bad}:5:5" in message and "did you mean `threshold`?" in message
    validate = run_loopctl(loopctl, "validate", str(bad))
    assert validate.returncode == 1
    # The same rendered diagnostic, line for line.
    report = [line for line in message.splitlines() if "treshold" in line]
    assert report and all(line in validate.stdout + validate.stderr for line in report)
    with pytest.raises(OSError):
        loopguard.Policy.load(tmp_path / "missing.yaml")


def test_a_policy_from_a_file_and_its_overrides(tmp_path):
    policy_file = tmp_path / "strict.yaml"
    policy_file.write_text("version: 1\nname: strict\nextends: builtin:default\n")
    policy = loopguard.Policy.load(policy_file)
    assert policy.name == "strict"
    engine = loopguard.Engine(policy, backend="openai", model="gpt-x")
    assert Action.BLOCK in [v.action for v in loop(engine, "s", 5)]


def test_a_session_target_applies_the_overrides_matching_its_model(tmp_path):
    policy_file = tmp_path / "targets.yaml"
    policy_file.write_text(
        "version: 1\nname: targets\nextends: builtin:default\n"
        "overrides:\n"
        "  - match: { model: \"*-mini*\" }\n"
        "    detectors:\n"
        "      exact_repeat: { threshold: 2 }\n"
    )
    engine = loopguard.Engine(loopguard.Policy.load(policy_file), backend="openai", model="gpt-x")
    engine.set_session_target("small", model="gpt-4o-mini")
    assert engine.session_target("small") == {"backend": "openai", "model": "gpt-4o-mini"}
    assert engine.session_target("big") == {"backend": "openai", "model": "gpt-x"}
    # The small model's session is stopped sooner than the engine's own rules would stop it.
    # (`deploy` is in no category, so the policy's top-level detectors, which the override
    # replaces, judge it.)
    first_small = next(
        i for i, v in enumerate(loop(engine, "small", 6, "deploy", {"env": "prod"})) if not v.is_allow
    )
    first_big = next(
        i for i, v in enumerate(loop(engine, "big", 6, "deploy", {"env": "prod"})) if not v.is_allow
    )
    assert first_small < first_big


def test_session_settings_switch_detection_off():
    engine = loopguard.Engine()
    engine.set_session_settings("quiet", enabled=False)
    assert engine.session_settings("quiet") == {"enabled": False}
    assert all(v.is_allow for v in loop(engine, "quiet", 8))
    engine.set_session_settings("strict", max_repeats=2)
    assert not all(v.is_allow for v in loop(engine, "strict", 3))


def test_snapshots_carry_a_session_over():
    a = loopguard.Engine()
    loop(a, "s", 3)
    snap = a.snapshot_session("s")
    assert snap is not None and a.snapshot_session("nobody") is None
    b = loopguard.Engine()
    b.restore_session("s", snap)
    # The fourth repeat is blocked in the engine the session moved to, as it would have been.
    assert b.call("s", "c3", "read_file", {"path": "a.txt"}).action == Action.BLOCK
    with pytest.raises(loopguard.SnapshotError):
        b.restore_session("s", '{"version": 999}')
    c = loopguard.Engine()
    assert c.restore(a.snapshot()) == 1


def test_groups_count_across_workers():
    engine = loopguard.Engine()
    for w in range(3):
        engine.join_group(f"w{w}", "swarm", f"worker-{w}")
    actions = []
    for i in range(12):
        w = i % 3
        actions.append(engine.call(f"w{w}", f"c{i}", "web_search", {"query": "same question"}).action)
    assert any(a != Action.ALLOW for a in actions)
    engine.clear_group("swarm")
    engine.leave_group("w0")


def test_user_reset_and_text():
    engine = loopguard.Engine()
    loop(engine, "s", 3)
    assert engine.user("s", "continue", automated=True).is_allow
    engine.reset("s")
    assert all(v.is_allow for v in loop(engine, "s", 2))
    texts = [engine.text("t", "I will now check the file again.").action for _ in range(6)]
    assert Action.ALLOW != texts[-1]


def test_observe_messages_reads_only_what_is_new():
    engine = loopguard.Engine()
    messages = [{"role": "user", "content": "fix the build"}]
    found = []
    for i in range(6):
        messages.append({
            "role": "assistant",
            "tool_calls": [{"id": f"c{i}", "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"command": "cargo build"})}}],
        })
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "error[E0425]: cannot find value `x`"})
        found.extend(engine.observe_messages("s", messages))
    actions = [v.action for v in found]
    assert actions and actions[0] == Action.WARN
    # Read again, nothing is new: nothing is observed twice.
    assert engine.observe_messages("s", messages) == []


def test_observe_messages_pairs_a_call_written_in_text_with_a_later_observation():
    # A ReAct agent's host observes after each model answer and again after each observation:
    # the observation, read apart from the answer, is still that action's result, not a
    # person's new words (which would set the counts back).
    def run(split):
        engine = loopguard.Engine()
        messages = [{"role": "user", "content": "find the config"}]
        found = []
        for _ in range(6):
            messages.append({"role": "assistant", "content":
                             "Thought: look for it\nAction: search\nAction Input: config loader"})
            if split:
                found.extend(engine.observe_messages("s", messages))
            messages.append({"role": "user", "content": "Observation: no results"})
            found.extend(engine.observe_messages("s", messages))
        return [(v.detector, v.action) for v in found]

    whole = run(split=False)
    assert whole and whole[0][1] == Action.WARN
    assert run(split=True) == whole


def test_threads_share_one_engine():
    engine = loopguard.Engine()
    results = {}

    def work(n):
        results[n] = [v.action for v in loop(engine, f"s{n}", 6)]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(map(tuple, results.values()))) == 1
    assert Action.TERMINATE in results[0]
