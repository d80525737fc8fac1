"""The Microsoft Agent Framework adapter, in a real Agent run loop, with a scripted chat client."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

# Agent Framework is a pinned test dependency (tests/requirements.txt): a missing one fails here.
from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
    tool,
)

import loopguard
from loopguard.adapters import Guard
from loopguard.adapters.agent_framework import AgentLoopTerminated, LoopGuard

CONTENT = "line 1: nothing changed here"
REFUSED = "[loopguard: refused] "
WARNING = "[loopguard: warning] "
#: Call ids unique across clients, as runs of one AgentSession share their history.
CALL_IDS = itertools.count(1)


class Scripted(FunctionInvocationLayer, BaseChatClient):
    """A chat client that answers each request with the next step of its script (tool calls or
    a text) and records the function results the requests carried to it, as the model reads
    them."""

    def __init__(self, steps):
        super().__init__()
        self.steps = list(steps)
        self.requests = 0
        self.results: list[Content] = []
        self.calls: dict[str, str] = {}

    def _inner_get_response(self, *, messages, stream, options, **kwargs):
        self.requests += 1
        seen = {r.call_id for r in self.results}
        for m in messages:
            for c in m.contents:
                if c.type == "function_result" and c.call_id not in seen:
                    self.results.append(c)
                    seen.add(c.call_id)
        step = self.steps.pop(0)
        if isinstance(step, str):
            contents = [Content.from_text(step)]
        else:
            # One call, or a list of calls made together (run concurrently by the framework).
            contents = []
            for name, args in step if isinstance(step, list) else [step]:
                call_id = f"call_{next(CALL_IDS)}"
                self.calls[call_id] = name
                arguments = json.dumps(args)
                contents.append(Content.from_function_call(call_id, name, arguments=arguments))
        if stream:

            async def updates():
                yield ChatResponseUpdate(role="assistant", contents=contents)

            return self._build_response_stream(updates())

        async def response():
            return ChatResponse(messages=[Message(role="assistant", contents=contents)])

        return response()

    def texts(self) -> list[str]:
        return [r.result for r in self.results]


def read_file_tool(runs: list[str]):
    @tool
    def read_file(path: str) -> str:
        """Reads a file."""
        runs.append(path)
        return CONTENT

    return read_file


def agent_with(client: Scripted, runs: list[str], **guard) -> Agent:
    return Agent(client=client, tools=[read_file_tool(runs)], middleware=[LoopGuard(**guard)])


def looping(n: int = 15) -> Scripted:
    return Scripted([("read_file", {"path": "a.txt"})] * n + ["done"])


def run(agent: Agent, prompt: str, **kwargs):
    return asyncio.run(agent.run(prompt, **kwargs))


def run_streamed(agent: Agent, prompt: str, **kwargs) -> list:
    async def go():
        return [u async for u in agent.run(prompt, stream=True, **kwargs)]

    return asyncio.run(go())


def check_loop(client: Scripted, runs: list[str], stopped: pytest.ExceptionInfo):
    """A run of the same call: warned, then refused (not run), then stopped."""
    assert isinstance(stopped.value, loopguard.LoopTerminated)
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    texts = client.texts()
    warned = next(i for i, t in enumerate(texts) if WARNING in t)
    refused = next(i for i, t in enumerate(texts) if REFUSED in t)
    assert warned < refused
    # A warned call ran: the model reads the tool's output, with the warning after it.
    assert texts[warned].startswith(CONTENT + "\n\n" + WARNING)
    # Refused calls never ran, and the run stopped before the script's end.
    n_refused = sum(REFUSED in t for t in texts)
    assert n_refused >= 1
    assert len(runs) == len(texts) - n_refused
    assert len(runs) < client.requests < 15
    assert client.steps  # the script was not played to its end


def test_a_looping_run_is_warned_refused_and_stopped():
    runs: list[str] = []
    client = looping()
    with pytest.raises(AgentLoopTerminated) as stopped:
        run(agent_with(client, runs, session="run-1"), "read a.txt")
    check_loop(client, runs, stopped)


def test_a_looping_streamed_run_is_warned_refused_and_stopped():
    runs: list[str] = []
    client = looping()
    with pytest.raises(AgentLoopTerminated) as stopped:
        run_streamed(agent_with(client, runs, session="run-1"), "read a.txt")
    check_loop(client, runs, stopped)


def test_a_streamed_run_awaited_whole_raises_too():
    runs: list[str] = []
    client = looping()
    agent = agent_with(client, runs, session="run-1")

    async def go():
        return await agent.run("read a.txt", stream=True).get_final_response()

    with pytest.raises(AgentLoopTerminated) as stopped:
        asyncio.run(go())
    check_loop(client, runs, stopped)


def history(session) -> list[Message]:
    """The messages an AgentSession keeps (the agent's default in-memory history)."""
    return list(session.state.get("in_memory", {}).get("messages", []))


def test_what_a_stopped_run_leaves_in_its_session():
    runs: list[str] = []
    agent = agent_with(looping(), runs)
    session = agent.create_session()
    with pytest.raises(AgentLoopTerminated):
        run(agent, "read a.txt", session=session)
    # A plain run that was stopped is not kept.
    assert history(session) == []

    agent = agent_with(looping(), runs)
    session = agent.create_session()
    updates: list = []

    async def go():
        stream = agent.run("read a.txt", stream=True, session=session)
        with pytest.raises(AgentLoopTerminated):
            async for u in stream:
                updates.append(u)
        assert history(session) == []
        # Asked again, the stream finishes: the response so far, which the session then keeps.
        return await stream.get_final_response()

    response = asyncio.run(go())
    # The last update and message are the stopped call, which has no result.
    stopped = updates[-1].contents
    assert [c.type for c in stopped] == ["function_call"]
    kept = history(session)
    assert kept[0].text == "read a.txt"
    assert kept[1:] == response.messages
    last = kept[-1].contents[-1]
    assert last.type == "function_call" and last.call_id == stopped[0].call_id
    answered = {c.call_id for m in kept for c in m.contents if c.type == "function_result"}
    assert last.call_id not in answered


class Service(Scripted):
    """A scripted client whose service keeps the conversation: each request carries only what is
    new, and each response names the conversation."""

    STORES_BY_DEFAULT = True

    def _inner_get_response(self, *, messages, stream, options, **kwargs):
        response = super()._inner_get_response(
            messages=messages, stream=stream, options=options, **kwargs
        )

        async def in_conversation():
            r = await response
            r.conversation_id = "conv-1"
            return r

        return in_conversation()


def test_a_conversation_kept_by_the_service_gets_a_result_for_the_stopped_call():
    runs: list[str] = []
    client = Service([("read_file", {"path": "a.txt"})] * 15 + ["done"])
    agent = agent_with(client, runs, session="run-8")
    session = agent.create_session()
    with pytest.raises(AgentLoopTerminated):
        run(agent, "read a.txt", session=session)
    # Before raising, the framework sends the service an error result for the stopped call (one
    # more request), so that the conversation can go on.
    settled, refused = client.results[-1], client.results[-2]
    assert settled.result.startswith("Error: Tool execution was aborted by middleware")
    assert REFUSED in refused.result
    # The stopped call is the one after the last refusal.
    calls = list(client.calls)
    assert calls.index(settled.call_id) == calls.index(refused.call_id) + 1
    assert session.service_session_id == "conv-1"


def test_a_refusal_is_the_function_result_of_the_refused_call():
    runs: list[str] = []
    client = looping()
    with pytest.raises(AgentLoopTerminated):
        run(agent_with(client, runs, session="run-1"), "read a.txt")
    refusals = [r for r in client.results if REFUSED in r.result]
    assert refusals
    for r in refusals:
        # The result answers the refused call, and is the refusal alone: not the file's content.
        assert client.calls[r.call_id] == "read_file"
        assert r.result.startswith(REFUSED)
        assert CONTENT not in r.result
        assert [i.text for i in r.items] == [r.result]
    # Every other result is the tool's own output (a warning after it at most).
    assert all(r.result.startswith(CONTENT) for r in client.results if r not in refusals)


def test_a_healthy_run_is_never_touched():
    runs: list[str] = []
    files = [f"src/f{i}.rs" for i in range(6)]
    client = Scripted([("read_file", {"path": f}) for f in files] + ["done"])
    response = run(agent_with(client, runs, session="run-1"), "read the sources")
    assert response.text == "done"
    assert runs == files
    assert client.texts() == [CONTENT] * 6
    assert all(r.exception is None for r in client.results)
    assert "loopguard" not in json.dumps([m.to_dict() for m in response.messages], default=str)


def test_a_healthy_streamed_run_is_never_touched():
    runs: list[str] = []
    files = [f"src/f{i}.rs" for i in range(6)]
    client = Scripted([("read_file", {"path": f}) for f in files] + ["done"])
    updates = run_streamed(agent_with(client, runs), "read the sources")
    assert "done" in "".join(u.text for u in updates)
    assert runs == files
    assert client.texts() == [CONTENT] * 6


def test_calls_made_together_are_each_guarded():
    runs: list[str] = []
    together = [("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})]
    pairs = [
        [("read_file", {"path": f"src/f{i}.rs"}), ("read_file", {"path": f"doc/f{i}.md"})]
        for i in range(3)
    ]
    healthy = Scripted(pairs + ["done"])
    assert run(agent_with(healthy, runs, session="run-5"), "read").text == "done"
    assert len(runs) == 6 and healthy.texts() == [CONTENT] * 6

    runs.clear()
    client = Scripted([together] * 8 + ["done"])
    with pytest.raises(AgentLoopTerminated):
        run(agent_with(client, runs, session="run-6"), "read a.txt and b.txt")
    texts = client.texts()
    n_refused = sum(REFUSED in t for t in texts)
    assert any(WARNING in t for t in texts) and n_refused >= 1
    assert len(runs) == len(texts) - n_refused
    assert client.steps


def test_a_rich_result_is_warned_after_its_items():
    image = Content.from_data(b"\x89PNG\r\n\x1a\n", "image/png")

    @tool
    def screenshot(page: str) -> list:
        """Takes a screenshot."""
        return [Content.from_text(f"screenshot of {page}"), image]

    client = Scripted([("screenshot", {"page": "home"})] * 3 + ["done"])
    agent = Agent(client=client, tools=[screenshot], middleware=[LoopGuard(session="run-7")])
    assert run(agent, "look at home").text == "done"
    first = client.results[0]
    assert [i.type for i in first.items] == ["text", "data"]
    warned = [r for r in client.results if WARNING in r.result]
    assert warned
    for r in warned:
        # The tool's items as they were, then the warning.
        assert [i.type for i in r.items] == ["text", "data", "text"]
        assert r.items[0].text == "screenshot of home" and r.items[1].uri == image.uri
        assert r.items[2].text.startswith(WARNING)


class Recording(Guard):
    """A guard that records the results it observes."""

    def __init__(self, session: str):
        super().__init__(session=session, error=AgentLoopTerminated)
        self.results: list[tuple[str, bool]] = []

    def on_result(self, call_id, output, error=False):
        self.results.append((output, error))
        return super().on_result(call_id, output, error)


def test_an_exception_of_the_tool_is_a_failed_result():
    @tool
    def deploy(target: str) -> str:
        """Deploys."""
        raise RuntimeError(f"{target} is on fire")

    guard = Recording("run-3")
    client = Scripted([("deploy", {"target": "a"}), ("deploy", {"target": "b"}), "done"])
    agent = Agent(client=client, tools=[deploy], middleware=[LoopGuard(guard=guard)])
    assert run(agent, "deploy").text == "done"
    assert guard.results == [
        ("RuntimeError: a is on fire", True),
        ("RuntimeError: b is on fire", True),
    ]
    # What the model reads is the framework's own error result, marked failed.
    assert client.texts() == ["Error: Function failed."] * 2
    assert [r.exception for r in client.results] == ["a is on fire", "b is on fire"]


def test_a_run_middleware_warns_a_structured_result_as_its_json_text():
    runs: list[str] = []

    @tool
    def stat(path: str) -> dict:
        """Describes a file."""
        runs.append(path)
        return {"path": path, "size": 3}

    client = Scripted([("stat", {"path": "a.txt"})] * 3 + ["done"])
    agent = Agent(client=client, tools=[stat])
    response = run(agent, "stat a.txt", middleware=[LoopGuard(session="run-2")])
    assert response.text == "done"
    assert len(runs) == 3
    texts = client.texts()
    assert texts[0] == '{"path": "a.txt", "size": 3}'
    warned = [t for t in texts if WARNING in t]
    assert warned and all(t.startswith(texts[0] + "\n\n" + WARNING) for t in warned)


def test_the_session_is_the_runs_agent_session_unless_one_is_given():
    def two_reads():
        return [("read_file", {"path": "a.txt"})] * 2 + ["done"]

    def warned(client: Scripted) -> bool:
        return any(WARNING in t for t in client.texts())

    guard = LoopGuard(engine=loopguard.Engine())
    first, again, other = Scripted(two_reads()), Scripted(two_reads()), Scripted(two_reads())
    runs: list[str] = []
    one = Agent(client=first, tools=[read_file_tool(runs)], middleware=[guard])
    session = one.create_session()
    run(one, "read a.txt", session=session)
    assert not warned(first) and len(runs) == 2
    # The same AgentSession again: the calls add up, and the repeats are warned (or refused).
    runs.clear()
    two = Agent(client=again, tools=[read_file_tool(runs)], middleware=[guard])
    run(two, "read a.txt", session=session)
    assert warned(again)
    # Another AgentSession starts afresh.
    runs.clear()
    other_agent = Agent(client=other, tools=[read_file_tool(runs)], middleware=[guard])
    run(other_agent, "read a.txt", session=other_agent.create_session())
    assert not warned(other) and len(runs) == 2
    assert other.texts() == [CONTENT] * 2


def test_a_given_session_is_shared_by_every_run():
    guard = LoopGuard(session="run-4")
    runs: list[str] = []
    clients = [Scripted([("read_file", {"path": "a.txt"})] * 2 + ["done"]) for _ in range(2)]
    for client in clients:
        agent = Agent(client=client, tools=[read_file_tool(runs)], middleware=[guard])
        run(agent, "read a.txt", session=agent.create_session())
    assert not any(WARNING in t for t in clients[0].texts())
    assert any(WARNING in t or REFUSED in t for t in clients[1].texts())
