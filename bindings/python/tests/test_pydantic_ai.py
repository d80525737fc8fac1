"""The PydanticAI adapter, in a real Agent run loop, with a scripted FunctionModel."""

from __future__ import annotations

import pytest

# PydanticAI is a pinned test dependency (tests/requirements.txt): a missing one fails here.
from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import loopguard
from loopguard.adapters.pydantic_ai import AgentLoopTerminated, LoopGuard

CONTENT = "line 1: nothing changed here"


class Scripted:
    """Answers with the next step of its script; records the tool returns it was sent."""

    def __init__(self, steps):
        self.steps = list(steps)
        self.returns: list[ToolReturnPart] = []
        self.requests = 0

    def __call__(self, messages, info: AgentInfo) -> ModelResponse:
        self.requests += 1
        last = messages[-1]
        if isinstance(last, ModelRequest):
            self.returns += [p for p in last.parts if isinstance(p, ToolReturnPart)]
        step = self.steps.pop(0)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        name, args = step
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call_{self.requests}")])


def agent_with(script: Scripted, runs: list[str]) -> Agent:
    agent = Agent(FunctionModel(script), capabilities=[LoopGuard(session="run-1")])

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Reads a file."""
        runs.append(path)
        return CONTENT

    return agent


def test_a_looping_run_is_warned_refused_and_stopped():
    runs: list[str] = []
    script = Scripted([("read_file", {"path": "a.txt"})] * 15 + ["done"])
    with pytest.raises(AgentLoopTerminated) as stopped:
        agent_with(script, runs).run_sync("read a.txt")
    assert isinstance(stopped.value, loopguard.LoopTerminated)
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    texts = [r.model_response_str() for r in script.returns]
    warned = next(i for i, t in enumerate(texts) if "[loopguard: warning]" in t)
    refused = next(i for i, t in enumerate(texts) if "[loopguard: refused]" in t)
    assert warned < refused
    # A warned call ran: its output is the tool's, with the warning after it.
    assert texts[warned].startswith(CONTENT + "\n\n[loopguard: warning] ")
    assert script.returns[warned].outcome == "success"
    # Refused calls never ran, and the run stopped before the script's end.
    n_refused = sum("[loopguard: refused]" in t for t in texts)
    assert n_refused >= 1
    assert len(runs) == len(script.returns) - n_refused
    assert len(runs) < script.requests < 15


def test_a_refusal_is_a_failed_tool_return():
    runs: list[str] = []
    script = Scripted([("read_file", {"path": "a.txt"})] * 15 + ["done"])
    with pytest.raises(AgentLoopTerminated):
        agent_with(script, runs).run_sync("read a.txt")
    refusals = [r for r in script.returns if "[loopguard: refused]" in r.model_response_str()]
    assert refusals
    for r in refusals:
        assert r.outcome == "failed"
        assert r.tool_name == "read_file"
        assert r.model_response_str(wrap_if_error=False).startswith("[loopguard: refused] ")
        # The model reads it as an error, not as the file's content.
        assert r.model_response_str().startswith('{"error":')
        assert CONTENT not in r.model_response_str()
    # Every other return is the tool's own output.
    assert all(r.outcome == "success" for r in script.returns if r not in refusals)


def test_a_healthy_run_is_never_touched():
    runs: list[str] = []
    script = Scripted([("read_file", {"path": f"src/f{i}.rs"}) for i in range(6)] + ["done"])
    result = agent_with(script, runs).run_sync("read the sources")
    assert result.output == "done"
    assert runs == [f"src/f{i}.rs" for i in range(6)]
    assert [r.content for r in script.returns] == [CONTENT] * 6
    assert all(r.outcome == "success" for r in script.returns)
    assert "loopguard" not in "\n".join(str(m) for m in result.all_messages())


def test_a_run_capability_warns_a_structured_result_as_its_json_text():
    runs: list[str] = []
    script = Scripted([("stat", {"path": "a.txt"})] * 3 + ["done"])
    agent = Agent(FunctionModel(script))

    @agent.tool_plain
    def stat(path: str) -> dict:
        """Describes a file."""
        runs.append(path)
        return {"path": path, "size": 3}

    result = agent.run_sync("stat a.txt", capabilities=[LoopGuard(session="run-2")])
    assert result.output == "done"
    assert len(runs) == 3
    texts = [r.model_response_str() for r in script.returns]
    assert texts[0] == '{"path":"a.txt","size":3}'
    assert script.returns[0].content == {"path": "a.txt", "size": 3}
    warned = [t for t in texts if "[loopguard: warning]" in t]
    assert warned and all(t.startswith('{"path":"a.txt","size":3}\n\n[loopguard: warning] ') for t in warned)
