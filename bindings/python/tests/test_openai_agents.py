"""The OpenAI Agents SDK adapter, in the SDK's real run loop, with a scripted model."""

from __future__ import annotations

import json

import pytest

# The SDK is a pinned test dependency (tests/requirements.txt): a missing one fails here.
from agents import Agent, ModelResponse, Runner, Usage, function_tool  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import loopguard  # noqa: E402
from loopguard.adapters.openai_agents import protect  # noqa: E402


def call(n: int, name: str, args: dict) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{n}", call_id=f"call_{n}", name=name, arguments=json.dumps(args),
        type="function_call", status="completed",
    )


def answer(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final", role="assistant", status="completed", type="message",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


class Scripted(Model):
    """A model that answers with the next step of its script and records what it was sent."""

    def __init__(self, steps):
        self.steps = list(steps)
        self.inputs: list[str] = []

    async def get_response(self, system_instructions, input, *args, **kwargs):
        self.inputs.append(json.dumps(input, default=str))
        return ModelResponse(output=[self.steps.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def agent_with(model: Scripted, runs: list[str]):
    @function_tool
    def read_file(path: str) -> str:
        """Reads a file."""
        runs.append(path)
        return "line 1: nothing changed here"

    return Agent(name="coder", model=model, tools=protect([read_file], session="run-1"))


def test_a_looping_run_is_warned_refused_and_stopped():
    runs: list[str] = []
    model = Scripted([call(i, "read_file", {"path": "a.txt"}) for i in range(12)] + [answer("done")])
    with pytest.raises(loopguard.LoopTerminated) as stopped:
        Runner.run_sync(agent_with(model, runs), "read a.txt", max_turns=30)
    seen = "\n".join(model.inputs)
    assert "[loopguard: warning]" in seen
    assert "[loopguard: refused]" in seen
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    # The refused calls never ran; the run stopped before the script's end.
    assert len(runs) < len(model.inputs) < 13
    warned = seen.index("[loopguard: warning]")
    assert warned < seen.index("[loopguard: refused]")


def test_a_healthy_run_is_never_touched():
    runs: list[str] = []
    model = Scripted([call(i, "read_file", {"path": f"src/f{i}.rs"}) for i in range(6)] + [answer("done")])
    result = Runner.run_sync(agent_with(model, runs), "read the sources", max_turns=30)
    assert result.final_output == "done"
    assert len(runs) == 6
    assert "loopguard" not in "\n".join(model.inputs)
