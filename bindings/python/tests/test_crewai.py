"""The CrewAI adapter, in real Crew and Agent runs, with a scripted LLM.

CrewAI runs in its own virtual environment (tests/requirements-crewai.txt: it cannot share one
with openai-agents); scripts/test runs this module there.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading

# No telemetry, no tracing, and CrewAI's files (its task outputs database, a credentials key,
# a settings directory) in a temporary home rather than the user's: set before crewai is
# imported (this module runs in a process of its own, see above).
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["OTEL_SDK_DISABLED"] = "true"
_home = tempfile.TemporaryDirectory(prefix="loopguard-crewai-")  # removed at exit
os.environ["HOME"] = _home.name
os.environ.pop("XDG_DATA_HOME", None)
os.environ.pop("XDG_CONFIG_HOME", None)

import pytest

# CrewAI is a pinned test dependency (tests/requirements-crewai.txt): a missing one fails here.
from crewai import Agent, Crew, Task
from crewai.hooks import register_before_tool_call_hook, unregister_before_tool_call_hook
from crewai.hooks.dispatch import InterceptionPoint, register_scoped
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool
from crewai.utilities.i18n import I18N_DEFAULT

import loopguard
from loopguard.adapters.crewai import AgentLoopTerminated, LoopGuard

# CrewAI's own code reads its deprecated attributes (function_calling_llm, …) on every run.
pytestmark = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:crewai(\..*)?")

CONTENT = "line 1: nothing changed here"
WARNING = "[loopguard: warning] "
REFUSED = "[loopguard: refused] "
REUSE_GUARD = "I tried reusing the same input"


class Scripted(BaseLLM):
    """Answers each call with the next step of its script: a tool call (native function calling,
    or ReAct text when ``native`` is false) or, for a string, the final answer. Keeps the
    messages of every call."""

    steps: list = []
    native: bool = True
    requests: list = []

    def call(self, messages, tools=None, callbacks=None, available_functions=None,
             from_task=None, from_agent=None, response_model=None, **kwargs):
        self.requests.append(json.loads(json.dumps(messages, default=str)))
        step = self.steps.pop(0)
        if isinstance(step, str):
            return step if self.native else f"Thought: I know it now\nFinal Answer: {step}"
        if not self.native:
            name, args = step
            return f"Thought: I read it\nAction: {name}\nAction Input: {json.dumps(args)}"
        # A list of calls is one answer with several tool calls (CrewAI runs them in threads).
        n = len(self.requests)
        return [{"id": f"call_{n}_{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(step if isinstance(step, list) else [step])]

    def supports_function_calling(self) -> bool:
        return self.native

    def get_context_window_size(self) -> int:
        return 200_000

    def tool_results(self) -> list[str]:
        """What the model was sent for its tool calls, in order, as of its last request."""
        if not self.requests:
            return []
        last = self.requests[-1]
        if self.native:
            return [m["content"] for m in last if m.get("role") == "tool"]
        return [m["content"].split("\nObservation: ", 1)[1] for m in last
                if m.get("role") == "assistant" and "\nObservation: " in m["content"]]


class ReadFile(BaseTool):
    """A tool that records each real execution."""

    name: str = "read_file"
    description: str = "Reads a file."
    runs: list = []
    gate: object = None

    def _run(self, path: str) -> str:
        self.runs.append(path)
        if self.gate is not None and len(self.runs) == 1:
            # Two crews' first calls meet here, so that their calls overlap.
            self.gate.wait(timeout=30)
        return CONTENT


def llm(steps, native=True) -> Scripted:
    return Scripted(model="scripted", steps=list(steps), native=native, requests=[])


def crew_with(model: Scripted, tool: ReadFile) -> Crew:
    agent = Agent(role="reader", goal="read the files", backstory="a careful reader",
                  llm=model, tools=[tool], verbose=False)
    task = Task(description="Read the files.", expected_output="done", agent=agent)
    # No cache: every call that goes through runs the tool, so runs count real executions.
    return Crew(agents=[agent], tasks=[task], verbose=False, cache=False)


def loop(n=15):
    return [("read_file", {"path": "a.txt"})] * n + ["done"]


class Reference:
    """The same events on a bare engine with the default policy: what the model should read
    for each call (a refused call's refusal; a call that ran, its output and the warnings)."""

    def __init__(self):
        self.engine = loopguard.Engine()
        self.verdicts: dict = {}
        self.texts: dict = {}

    def call(self, call_id: str, path: str) -> loopguard.Verdict:
        v = self.engine.call("reference", call_id, "read_file", {"path": path})
        self.verdicts[call_id] = v
        if v.action in (loopguard.Action.BLOCK, loopguard.Action.ASK):
            self.texts[call_id] = REFUSED + v.message
        return v

    def result(self, call_id: str, output: str) -> None:
        r = self.engine.result("reference", call_id, output)
        notes = [x.message for x in (self.verdicts[call_id], r) if x.action == loopguard.Action.WARN]
        self.texts[call_id] = output + ("\n\n" + "\n".join(WARNING + n for n in notes) if notes else "")


def reference(output: str):
    """What the model should read for the same call made again and again, each run answering
    ``output``, up to the call loopguard stops; and the stop's message."""
    ref = Reference()
    for i in range(100):
        v = ref.call(f"c{i}", "a.txt")
        if v.action == loopguard.Action.TERMINATE:
            return [ref.texts[k] for k in sorted(ref.texts, key=lambda k: int(k[1:]))], v.message
        if f"c{i}" not in ref.texts:
            ref.result(f"c{i}", output)
    raise AssertionError("the reference loop was never stopped")


def assert_warned_refused_stopped(model: Scripted, tool: ReadFile, stopped):
    assert isinstance(stopped.value, loopguard.LoopTerminated)
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    expected, message = reference(CONTENT)
    # The default policy warns, then refuses, then stops.
    warned = next(i for i, t in enumerate(expected) if WARNING in t)
    refused = next(i for i, t in enumerate(expected) if t.startswith(REFUSED))
    assert 0 < warned < refused
    # The model read each result as the engine decided, at the same points: untouched, then
    # the output with the warning after it, then refusals.
    texts = model.tool_results()
    assert texts == expected
    assert str(stopped.value) == message
    # The stopped call got no result and its model was not asked again (no CrewAI retry);
    # refused calls never ran.
    assert len(model.requests) == len(texts) + 1
    n_refused = sum(t.startswith(REFUSED) for t in texts)
    assert n_refused >= 1
    assert tool.runs == ["a.txt"] * (len(texts) - n_refused)


def test_a_looping_crew_is_warned_refused_and_stopped():
    model, tool = llm(loop()), ReadFile(runs=[])
    with pytest.raises(AgentLoopTerminated) as stopped:
        with LoopGuard(session="crew-1"):
            crew_with(model, tool).kickoff()
    assert_warned_refused_stopped(model, tool, stopped)
    # CrewAI's own repeated-call guard (5 identical calls with the same result) never fired.
    assert len(model.requests) < 15


@pytest.mark.parametrize("kickoff", ["kickoff_async", "akickoff"])
def test_an_async_crew_is_stopped_too(kickoff):
    model, tool = llm(loop()), ReadFile(runs=[])

    async def run():
        with LoopGuard(session=f"crew-{kickoff}"):
            await getattr(crew_with(model, tool), kickoff)()

    with pytest.raises(AgentLoopTerminated) as stopped:
        asyncio.run(run())
    assert_warned_refused_stopped(model, tool, stopped)


def test_an_agent_kickoff_is_stopped_too():
    model, tool = llm(loop()), ReadFile(runs=[])
    agent = Agent(role="reader", goal="read the files", backstory="a careful reader",
                  llm=model, tools=[tool], verbose=False)
    with pytest.raises(AgentLoopTerminated) as stopped:
        with LoopGuard(session="agent-1"):
            agent.kickoff("Read a.txt.")
    assert_warned_refused_stopped(model, tool, stopped)


def test_a_healthy_crew_is_never_touched():
    paths = [f"src/f{i}.rs" for i in range(6)]
    model, tool = llm([("read_file", {"path": p}) for p in paths] + ["done"]), ReadFile(runs=[])
    with LoopGuard(session="crew-2"):
        result = crew_with(model, tool).kickoff()
    assert result.raw == "done"
    assert tool.runs == paths
    assert model.tool_results() == [CONTENT] * 6
    assert "loopguard" not in json.dumps(model.requests)


class HeldRead(BaseTool):
    """Reads a file; a read of ``c.txt`` holds until ``release`` is set."""

    name: str = "read_file"
    description: str = "Reads a file."
    runs: list = []
    started: object = None
    release: object = None

    def _run(self, path: str) -> str:
        self.runs.append(path)
        if path == "c.txt":
            self.started.set()
            self.release.wait(timeout=30)
        return f"{CONTENT} ({path})"


def test_calls_of_one_answer_in_two_threads_each_get_their_own_verdict():
    # a.txt three times, then a.txt and c.txt in one answer, which CrewAI runs in two threads.
    # Hooks of the test fix the order: c.txt's call starts and its tool holds; a.txt's call is
    # made and gets its result; then c.txt's tool returns. Each call's verdicts are the ones a
    # bare engine gives for that order, and each reaches its own tool result.
    a, c = ("read_file", {"path": "a.txt"}), ("read_file", {"path": "c.txt"})
    model = llm([a] * 3 + [[a, c]] + ["done"])
    tool = HeldRead(runs=[], started=threading.Event(), release=threading.Event())

    def a_waits_for_c(context):  # global: runs before loopguard's hooks
        if context.tool_input.get("path") == "a.txt" and len(tool.runs) == 3:
            tool.started.wait(timeout=30)

    def then_c_returns(context):  # in the run's scope, after loopguard's hook
        if context.tool_input.get("path") == "a.txt" and len(tool.runs) >= 3:
            tool.release.set()

    register_before_tool_call_hook(a_waits_for_c)
    try:
        with LoopGuard(session="batch-1"):
            register_scoped(InterceptionPoint.POST_TOOL_CALL, then_c_returns)
            result = crew_with(model, tool).kickoff()
    finally:
        unregister_before_tool_call_hook(a_waits_for_c)
    assert result.raw == "done"

    ref = Reference()
    for i in (1, 2, 3):
        ref.call(f"call_{i}_0", "a.txt")
        ref.result(f"call_{i}_0", f"{CONTENT} (a.txt)")
    ref.call("call_4_1", "c.txt")
    ref.call("call_4_0", "a.txt")
    ref.result("call_4_0", f"{CONTENT} (a.txt)")
    ref.result("call_4_1", f"{CONTENT} (c.txt)")
    results = {m["tool_call_id"]: m["content"] for m in model.requests[-1] if m["role"] == "tool"}
    assert results == ref.texts
    assert tool.runs == ["a.txt"] * 3 + ["c.txt", "a.txt"]
    # The 4th read of a.txt is warned (the loop goes on, with c.txt between); c.txt is untouched.
    assert results["call_4_0"].startswith(f"{CONTENT} (a.txt)\n\n{WARNING}")
    assert results["call_4_1"] == f"{CONTENT} (c.txt)"


def loopguard_part(text: str) -> str:
    """What loopguard wrote in a tool result: from its first note on."""
    at = text.find("[loopguard: ")
    return text[at:] if at >= 0 else ""


def test_react_text_calls_and_crewai_reuse_guard():
    # Without native function calling, CrewAI parses "Action: …" text and answers a call that
    # repeats the one before with its own reuse-guard sentence, without running the tool
    # (loopguard reads that sentence as the host refusing the call, no new outcome).
    model, tool = llm(loop(), native=False), ReadFile(runs=[])
    with pytest.raises(AgentLoopTerminated) as stopped:
        with LoopGuard(session="react-1"):
            crew_with(model, tool).kickoff()
    texts = model.tool_results()
    assert texts[0] == CONTENT
    assert all(t.startswith(REUSE_GUARD) or t.startswith(REFUSED) for t in texts[1:])
    # Only the first call ran: CrewAI's guard answered the next ones, loopguard refused the rest.
    assert tool.runs == ["a.txt"]
    # loopguard's notes are the engine's for these results, at the same points.
    reused = I18N_DEFAULT.errors("task_repeated_usage")
    ref, stop = Reference(), None
    for i in range(len(texts) + 1):
        v = ref.call(f"c{i}", "a.txt")
        if v.action == loopguard.Action.TERMINATE:
            stop = v
            break
        if f"c{i}" not in ref.texts:
            ref.result(f"c{i}", CONTENT if i == 0 else reused)
    expected = [ref.texts[f"c{i}"] for i in range(len(texts))]
    assert [loopguard_part(t) for t in texts] == [loopguard_part(t) for t in expected]
    assert any(WARNING in t for t in texts) and any(t.startswith(REFUSED) for t in texts)
    assert stop is not None and str(stopped.value) == stop.message
    assert len(model.requests) == len(texts) + 1


def test_react_results_are_observed_without_crewai_format_reminder():
    # Every third tool use CrewAI appends its tool list and format reminder to the result the
    # model reads; loopguard observes the tool's own output. Two reads taking turns (no reuse
    # guard: no call repeats the one before) are a cycle of the same results.
    a, b = ("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})
    model, tool = llm([a, b] * 7 + ["done"], native=False), ReadFile(runs=[])
    with pytest.raises(AgentLoopTerminated) as stopped:
        with LoopGuard(session="react-2"):
            crew_with(model, tool).kickoff()
    texts = model.tool_results()
    assert any("NEVER make up tools" in t for t in texts)
    ref, stop = Reference(), None
    for i in range(len(texts) + 1):
        v = ref.call(f"c{i}", "ab"[i % 2] + ".txt")
        if v.action == loopguard.Action.TERMINATE:
            stop = v
            break
        if f"c{i}" not in ref.texts:
            ref.result(f"c{i}", CONTENT)
    expected = [ref.texts[f"c{i}"] for i in range(len(texts))]
    assert [loopguard_part(t) for t in texts] == [loopguard_part(t) for t in expected]
    assert stop is not None and str(stopped.value) == stop.message
    assert len(tool.runs) == sum(not t.startswith(REFUSED) for t in texts)


def test_hooks_are_those_of_the_with_block_only():
    # The same three identical reads: the 3rd is warned inside a `with` block (the same call with
    # the same result three times), untouched after it.
    steps = [("read_file", {"path": "a.txt"})] * 3 + ["done"]
    inside = llm(steps)
    with LoopGuard(session="crew-3"):
        crew_with(inside, ReadFile(runs=[])).kickoff()
    assert inside.tool_results()[:2] == [CONTENT] * 2
    assert inside.tool_results()[2].startswith(CONTENT + "\n\n" + WARNING)
    outside = llm(steps)
    crew_with(outside, ReadFile(runs=[])).kickoff()
    assert outside.tool_results() == [CONTENT] * 3


def test_each_with_block_is_a_new_session_unless_one_is_given():
    engine = loopguard.Engine()
    steps = [("read_file", {"path": "a.txt"})] * 2 + ["done"]
    guard = LoopGuard(engine=engine)
    runs = []
    for _ in range(2):
        model = llm(steps)
        with guard:
            crew_with(model, ReadFile(runs=[])).kickoff()
        runs.append(model.tool_results())
    # Two reads a run: no loop in either.
    assert runs == [[CONTENT] * 2] * 2
    # The same two runs in one named session: the second run's first read is the 3rd.
    guard = LoopGuard(engine=engine, session="shared")
    runs = []
    for _ in range(2):
        model = llm(steps)
        with guard:
            crew_with(model, ReadFile(runs=[])).kickoff()
        runs.append(model.tool_results())
    assert runs[0] == [CONTENT] * 2
    assert runs[1][0].startswith(CONTENT + "\n\n" + WARNING)


def run_two_crews(sessions: list[str]):
    """Two crews kicked off at once in two threads, each in its own `with` block, whose tool
    calls overlap: each reads a.txt twice. Returns what each model was sent and what
    the runs raised."""
    engine = loopguard.Engine()
    gate = threading.Barrier(2)
    models = [llm([("read_file", {"path": "a.txt"})] * 2 + ["done"]) for _ in sessions]
    errors: list[BaseException] = []

    def run(model: Scripted, session: str):
        try:
            with LoopGuard(engine=engine, session=session):
                crew_with(model, ReadFile(runs=[], gate=gate)).kickoff()
        except BaseException as e:  # reported by the test
            errors.append(e)
            gate.abort()

    threads = [threading.Thread(target=run, args=(m, s)) for m, s in zip(models, sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [m.tool_results() for m in models], errors


def test_two_crews_in_two_sessions_do_not_mix():
    results, errors = run_two_crews(["crew-a", "crew-b"])
    assert not errors
    assert results == [[CONTENT] * 2, [CONTENT] * 2]


def test_two_crews_in_one_session_do_mix():
    # The control of the test above: four identical reads in one session are a loop (how it is
    # met depends on how the two runs' events interleave).
    results, errors = run_two_crews(["crew-c", "crew-c"])
    assert not errors
    assert any(WARNING in t or t.startswith(REFUSED) for r in results for t in r)
