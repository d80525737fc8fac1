"""The smolagents adapter, in a real ToolCallingAgent run loop, with a scripted model."""

from __future__ import annotations

import json

import pytest
from smolagents import ChatMessage, Model, ToolCallingAgent, tool
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole

import loopguard
from loopguard.adapters.smolagents import protect


class Scripted(Model):
    """Answers with the next step of its script; records what it was sent."""

    def __init__(self, steps):
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.sent: list[str] = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        self.sent.append(json.dumps([m.dict() if hasattr(m, "dict") else str(m) for m in messages], default=str))
        name, args = self.steps.pop(0)
        n = len(self.sent)
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content="",
            tool_calls=[ChatMessageToolCall(
                id=f"call_{n}", type="function",
                function=ChatMessageToolCallFunction(name=name, arguments=args),
            )],
        )


def agent_with(steps, runs: list[str]):
    @tool
    def read_file(path: str) -> str:
        """Reads a file.

        Args:
            path: The file to read.
        """
        runs.append(path)
        return "line 1: nothing changed here"

    model = Scripted(steps)
    agent = ToolCallingAgent(tools=[read_file], model=model, max_steps=20, verbosity_level=0)
    return protect(agent, session="run-1"), model


def test_a_looping_run_is_warned_refused_and_stopped():
    runs: list[str] = []
    steps = [("read_file", {"path": "a.txt"})] * 15 + [("final_answer", {"answer": "done"})]
    agent, model = agent_with(steps, runs)
    with pytest.raises(loopguard.LoopTerminated) as stopped:
        agent.run("read a.txt")
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    sent = model.sent[-1]
    assert "[loopguard: warning]" in sent
    assert "[loopguard: refused]" in sent
    assert sent.index("[loopguard: warning]") < sent.index("[loopguard: refused]")
    # Refused calls never ran, and the run stopped early.
    assert len(runs) < len(model.sent) < 15


def test_a_healthy_run_is_never_touched():
    runs: list[str] = []
    steps = [("read_file", {"path": f"src/f{i}.rs"}) for i in range(6)] + [("final_answer", {"answer": "done"})]
    agent, model = agent_with(steps, runs)
    assert agent.run("read the sources") == "done"
    assert len(runs) == 6
    assert "loopguard" not in "\n".join(model.sent)
