"""Real agent frameworks through the real `loopctl proxy`, with no code changes but the base URL:
the OpenAI Agents SDK (`Runner.run` and `Runner.run_streamed` on its chat-completions model) and
LangChain (`langchain-openai`'s `ChatOpenAI` with tools bound, `invoke` and `stream`), in front
of a scripted chat-completions upstream on 127.0.0.1 (plain and SSE).

What the README says a framework sees, checked here: a stop is the same `openai.APIError` with
code `tool_loop_terminated` streamed or not (`e.body["loopguard"]` names the detector); a refused
call reaches the framework as the model's text starting with `[loopguard] Refused:`; a run that
does not loop is untouched.
"""

from __future__ import annotations

import asyncio
import json
import threading

import openai
import pytest
from loopctl_proxy import Proxy, ScriptedServer

# The frameworks are pinned test dependencies (tests/requirements.txt): a missing one fails here.
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

# The SDK would otherwise export its traces to OpenAI.
set_tracing_disabled(True)

BUILD = {"command": "cargo build"}
TOOL_OUTPUT = "error: could not compile `app`"
DONE = "I read every file: résumé ✓, nothing left to do."
TASK = "build the project"
FILES = 3
# The pause after a streamed turn's text (seconds).
PAUSE = 0.3

# Like the Rust proxy tests' policy: the 3rd identical call is warned, the 4th refused, the 5th
# stops the run.
POLICY = """version: 1
name: frameworks
escalation: { ladder: default }
ladders:
  default:
    - { repeat: 1, action: warn, message: "Loop detected: {tool} called {count} times with the same arguments. Change your approach." }
    - { repeat: 2, action: block, message: "Refused: {tool} called {count} times with the same arguments. The call was not run." }
    - { repeat: 3, action: terminate, message: "Stopped: {tool} kept being called with the same arguments ({count} times)." }
detectors:
  exact_repeat: { threshold: 3 }
"""


# --- the scripted upstream ------------------------------------------------------------------


class Upstream(ScriptedServer):
    """A chat-completions server on 127.0.0.1, in a thread. Its models:

    - `loop`: the same `bash` call (`cargo build`) every turn, no text;
    - `chatty`: the same, with the text "Building." before the call;
    - `explore`: a `read_file` of a new path while fewer than FILES results came back, then
      the final text DONE.
    """

    pause = PAUSE

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        super().__init__()

    def post(self, request):
        if request.path.rstrip("/") != "/v1/chat/completions":
            request.send_error(404)
            return
        body = json.loads(request.rfile.read(int(request.headers["content-length"])))
        with self.lock:
            self.requests.append(body)
            n = len(self.requests)
        text, calls = self.turn(body, n)
        if body.get("stream"):
            include_usage = (body.get("stream_options") or {}).get("include_usage")
            events = [f"data: {json.dumps(c)}\n\n"
                      for c in chunks(body["model"], text, calls, include_usage)]
            events.append("data: [DONE]\n\n")
            # The text first, then a pause: the proxy passes text on as it comes, so
            # that a stop decided on the call after it is the stream's last event.
            cut = 3 if text else 0
            self.reply(request, ["".join(events[:cut]), "".join(events[cut:])], "text/event-stream")
        else:
            self.reply(request, [json.dumps(completion(body["model"], text, calls))], "application/json")

    @property
    def base(self) -> str:
        return self.address + "/v1"

    def turn(self, body: dict, n: int):
        """The scripted answer to request `n`: (text, [(call id, tool, arguments)])."""
        model = body["model"]
        if model == "loop":
            return None, [(f"call_{n}", "bash", BUILD)]
        if model == "chatty":
            return "Building.", [(f"call_{n}", "bash", BUILD)]
        if model == "explore":
            done = sum(1 for m in body["messages"] if m.get("role") == "tool")
            if done >= FILES:
                return DONE, []
            return None, [(f"call_{n}", "read_file", {"path": f"src/módulo_{done}.rs"})]
        raise AssertionError(f"no script for model {model}")



def completion(model: str, text, calls) -> dict:
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, name, args in calls
        ]
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def chunks(model: str, text, calls, include_usage) -> list[dict]:
    """The same turn as stream chunks: text in two deltas, arguments in 4-character fragments."""

    def chunk(delta, finish=None):
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if text:
        mid = len(text) // 2
        out += [chunk({"content": text[:mid]}), chunk({"content": text[mid:]})]
    for k, (i, name, args) in enumerate(calls):
        out.append(chunk({"tool_calls": [{"index": k, "id": i, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]}))
        a = json.dumps(args)
        for p in range(0, len(a), 4):
            out.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": a[p:p + 4]}}]}))
    out.append(chunk({}, "tool_calls" if calls else "stop"))
    if include_usage:
        out.append({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    return out


# --- the real proxy ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def make_proxy(loopctl, upstream, tmp_path):
    """Starts a new proxy (a clean slate: no session, no metric) and forgets what the upstream
    received so far; every proxy is stopped at the end of the test."""
    started = []

    def make() -> Proxy:
        upstream.requests.clear()
        d = tmp_path / str(len(started))
        d.mkdir()
        started.append(Proxy(loopctl, upstream.base, POLICY, d))
        return started[-1]

    yield make
    for p in started:
        p.close()


def stopped_as_the_readme_says(e: BaseException) -> dict:
    """The README's check, as written there: an `openai.APIError` whose `code` is
    `tool_loop_terminated`, whose `body["loopguard"]` names the detector. Returns what a
    comparison between runs needs."""
    assert isinstance(e, openai.APIError), repr(e)
    assert getattr(e, "code", None) == "tool_loop_terminated", repr(e)
    assert e.body["loopguard"]["detector"] == "exact_repeat", e.body
    assert e.body["loopguard"]["tool"] == "bash", e.body
    return {"class": type(e), "code": e.code, "status": getattr(e, "status_code", None),
            "type": e.body.get("type")}


def assert_warned_then_refused(upstream: Upstream):
    """What the model was told: the warning in the 3rd call's result (4th request), nothing
    before it."""
    seen = [json.dumps(r["messages"], ensure_ascii=False) for r in upstream.requests]
    assert not any("[loopguard]" in s for s in seen[:3]), seen[:3]
    assert "[loopguard] Loop detected: bash called 3 times" in seen[3], seen[3]


# --- the OpenAI Agents SDK --------------------------------------------------------------------


def sdk_agent(proxy: Proxy, model: str, runs: list):
    @function_tool
    def bash(command: str) -> str:
        """Runs a shell command."""
        runs.append(command)
        return TOOL_OUTPUT

    @function_tool
    def read_file(path: str) -> str:
        """Reads a file."""
        runs.append(path)
        return f"contents of {path}"

    client = openai.AsyncOpenAI(base_url=proxy.base + "/v1", api_key="sk-test", max_retries=0)
    return Agent(
        name="coder",
        instructions="You are a coding agent.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[bash, read_file],
    )


async def sdk_run(agent, task, stream: bool):
    """`Runner.run`, or `Runner.run_streamed` with its events drained; the run's result."""
    if not stream:
        return await Runner.run(agent, task, max_turns=20)
    result = Runner.run_streamed(agent, task, max_turns=20)
    async for _ in result.stream_events():
        pass
    return result


def test_the_agents_sdk_is_refused_then_stopped_the_same_way_streamed_or_not(make_proxy, upstream):
    stops = []
    for stream in [False, True]:
        proxy = make_proxy()
        runs: list[str] = []
        agent = sdk_agent(proxy, "loop", runs)

        async def go():
            # The 3rd call is warned (it runs), the 4th refused: the model's text ends the run.
            result = await sdk_run(agent, TASK, stream)
            assert runs == ["cargo build"] * 3
            assert isinstance(result.final_output, str)
            assert result.final_output.startswith("[loopguard] Refused:"), result.final_output
            assert "bash called 4 times" in result.final_output
            assert_warned_then_refused(upstream)
            # The person says go on; the model calls again: the run is stopped.
            with pytest.raises(openai.APIError) as stopped:
                await sdk_run(agent, result.to_input_list() + [{"role": "user", "content": "Go on."}], stream)
            assert runs == ["cargo build"] * 3
            return stopped_as_the_readme_says(stopped.value)

        stops.append(asyncio.run(go()))
        assert len(upstream.requests) == 5
        assert all(r.get("stream", False) == stream for r in upstream.requests)
    assert stops[0] == stops[1], "the same exception with and without streaming"
    assert stops[0] == {"class": openai.BadRequestError, "code": "tool_loop_terminated",
                        "status": 400, "type": "loop_detected"}


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_a_healthy_agents_sdk_run_is_untouched(make_proxy, upstream, stream):
    proxy = make_proxy()
    runs: list[str] = []
    result = asyncio.run(sdk_run(sdk_agent(proxy, "explore", runs), TASK, stream))
    assert result.final_output == DONE
    assert runs == [f"src/módulo_{i}.rs" for i in range(FILES)]
    assert_untouched(proxy, upstream)


def assert_untouched(proxy: Proxy, upstream: Upstream):
    assert len(upstream.requests) == FILES + 1
    assert "[loopguard]" not in json.dumps(upstream.requests, ensure_ascii=False)
    assert "loopguard_proxy_interventions_total{" not in proxy.metrics()


# --- LangChain ------------------------------------------------------------------------------------


@tool
def bash(command: str) -> str:
    """Runs a shell command."""
    return TOOL_OUTPUT


@tool
def read_file(path: str) -> str:
    """Reads a file."""
    return f"contents of {path}"


def chat_model(proxy: Proxy, model: str):
    llm = ChatOpenAI(model=model, base_url=proxy.base + "/v1", api_key="sk-test", max_retries=0)
    return llm.bind_tools([bash, read_file])


def lc_turn(llm, messages, stream: bool) -> AIMessage:
    """One model call: `invoke`, or `stream` with its chunks added up."""
    if not stream:
        return llm.invoke(messages)
    total = None
    for chunk in llm.stream(messages):
        total = chunk if total is None else total + chunk
    return total


def lc_run(llm, messages, stream: bool, turns: int) -> list[AIMessage]:
    """An agent loop: every call the model makes runs, until a turn without calls or `turns`."""
    answers = []
    for _ in range(turns):
        ai = lc_turn(llm, messages, stream)
        answers.append(ai)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for c in ai.tool_calls:
            out = {"bash": bash, "read_file": read_file}[c["name"]].invoke(c["args"])
            messages.append(ToolMessage(content=out, tool_call_id=c["id"]))
    return answers


def test_langchain_is_refused_then_stopped_the_same_way_streamed_or_not(make_proxy, upstream):
    stops = []
    for stream in [False, True]:
        llm = chat_model(make_proxy(), "loop")
        messages = [HumanMessage(TASK)]
        answers = lc_run(llm, messages, stream, turns=8)
        assert [len(a.tool_calls) for a in answers] == [1, 1, 1, 0]
        assert all(a.tool_calls[0]["args"] == BUILD for a in answers[:3])
        refused = answers[3]
        assert isinstance(refused.content, str)
        assert refused.content.startswith("[loopguard] Refused:"), refused.content
        assert_warned_then_refused(upstream)
        messages.append(HumanMessage("Go on."))
        with pytest.raises(openai.APIError) as stopped:
            lc_turn(llm, messages, stream)
        stops.append(stopped_as_the_readme_says(stopped.value))
        assert len(upstream.requests) == 5
        assert all(r.get("stream", False) == stream for r in upstream.requests)
    assert stops[0] == stops[1], "the same exception with and without streaming"
    # LangChain raises its own subclass of the client's BadRequestError, with the same body.
    assert issubclass(stops[0]["class"], openai.BadRequestError)
    assert {k: v for k, v in stops[0].items() if k != "class"} == {
        "code": "tool_loop_terminated", "status": 400, "type": "loop_detected"}


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_a_healthy_langchain_run_is_untouched(make_proxy, upstream, stream):
    proxy = make_proxy()
    llm = chat_model(proxy, "explore")
    answers = lc_run(llm, [HumanMessage(TASK)], stream, turns=8)
    assert [c["args"] for a in answers for c in a.tool_calls] == [
        {"path": f"src/módulo_{i}.rs"} for i in range(FILES)
    ]
    assert answers[-1].content == DONE
    assert not answers[-1].tool_calls
    assert_untouched(proxy, upstream)


# --- a model that talks beside its calls --------------------------------------------------------


def refusal_of(text: str) -> str:
    """The refusal in a turn's text: its last paragraph, after the model's own text."""
    return text.split("\n\n")[-1]


def test_after_streamed_text_a_stop_is_the_error_event_the_readme_catches(make_proxy, upstream):
    """With text before the call, a streamed turn's text reaches the client as it comes: the
    stop is the stream's last event, which the client raises as `openai.APIError` (not a status
    error), with the same code and body; the refusal follows the model's own text."""
    for stream in [False, True]:
        runs: list[str] = []
        agent = sdk_agent(make_proxy(), "chatty", runs)

        async def go():
            result = await sdk_run(agent, TASK, stream)
            assert result.final_output.startswith("Building.\n\n"), result.final_output
            assert refusal_of(result.final_output).startswith("[loopguard] Refused: bash called 4 times")
            with pytest.raises(openai.APIError) as stopped:
                await sdk_run(agent, result.to_input_list() + [{"role": "user", "content": "Go on."}], stream)
            return stopped_as_the_readme_says(stopped.value)

        stop = asyncio.run(go())
        assert runs == ["cargo build"] * 3
        assert stop["class"] is (openai.APIError if stream else openai.BadRequestError), stop

        llm = chat_model(make_proxy(), "chatty")
        messages = [HumanMessage(TASK)]
        answers = lc_run(llm, messages, stream, turns=8)
        assert [a.content for a in answers[:3]] == ["Building."] * 3
        assert refusal_of(answers[3].content).startswith("[loopguard] Refused: bash called 4 times")
        assert not answers[3].tool_calls
        messages.append(HumanMessage("Go on."))
        got = []
        with pytest.raises(openai.APIError) as stopped:
            if stream:
                for chunk in llm.stream(messages):
                    got.append(chunk.content)
            else:
                llm.invoke(messages)
        stop = stopped_as_the_readme_says(stopped.value)
        if stream:
            assert stop["class"] is openai.APIError, stop
            assert "".join(got) == "Building.", "the text came before the stop"
        else:
            assert issubclass(stop["class"], openai.BadRequestError), stop
