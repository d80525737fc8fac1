"""The official `google-genai` client through the real `loopctl proxy`, with no code change but
the base URL (`http_options=types.HttpOptions(base_url=...)`): an agent loop on
`client.models.generate_content` and `generate_content_stream` (which asks for
`streamGenerateContent?alt=sse`), and on a streamed chat (`chats.create`,
`send_message_stream`, whose history keeps each streamed piece as a content of its own), in
front of a scripted Gemini upstream on 127.0.0.1 whose calls carry no id, as Gemini's do.

What the docs say a Gemini client sees, checked here: a run that does not loop is untouched; the
3rd identical call is warned (the nudge reaches the model in that call's function response); the
4th is refused (no call, the model's text ends with `[loopguard] Refused:`); the 5th stops the
run with the same `google.genai.errors.ClientError` (400, `FAILED_PRECONDITION`, reason
`tool_loop_terminated`) streamed or not.
"""

from __future__ import annotations

import json
import threading

import pytest
from loopctl_proxy import Proxy, ScriptedServer

# A pinned test dependency (tests/requirements.txt): missing fails here.
from google import genai
from google.genai import errors, types

KEY = "AIzaSy-loopguard-test-key-0123456789"
BUILD = {"command": "cargo build"}
TOOL_OUTPUT = "error: could not compile `app`"
DONE = "I read every file: résumé ✓, nothing left to do."
FILES = 3
# The pause after a streamed answer's text (seconds).
PAUSE = 0.3
NUDGE = ("[loopguard] Loop detected: bash called 3 times with the same arguments. "
         "Change your approach.")

POLICY = """version: 1
name: gemini
escalation: { ladder: default }
ladders:
  default:
    - { repeat: 1, action: warn, message: "Loop detected: {tool} called {count} times with the same arguments. Change your approach." }
    - { repeat: 2, action: block, message: "Refused: {tool} called {count} times with the same arguments. The call was not run." }
    - { repeat: 3, action: terminate, message: "Stopped: {tool} kept being called with the same arguments ({count} times)." }
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
"""

TOOLS = [types.Tool(function_declarations=[
    types.FunctionDeclaration(
        name="bash", description="Runs a command.",
        parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")})),
    types.FunctionDeclaration(
        name="read_file", description="Reads a file.",
        parameters=types.Schema(type="OBJECT", properties={"path": types.Schema(type="STRING")})),
])]


class Upstream(ScriptedServer):
    """A Gemini API on 127.0.0.1 (`POST /v1/models/{model}:{method}`, and `/v1beta/…`), in a
    thread. Its models: `loop` ("Building." and the same `bash` call every answer) and `explore` (a
    `read_file` of a new path while fewer than FILES results came back, then DONE)."""

    pause = PAUSE

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        super().__init__()

    def post(self, request):
        path, _, query = request.path.partition("?")
        version, _, rest = path[1:].partition("/models/")
        if version not in ("v1", "v1beta") or ":" not in rest:
            request.send_error(404)
            return
        model, method = rest.split(":", 1)
        body = json.loads(request.rfile.read(int(request.headers["content-length"])))
        with self.lock:
            self.requests.append({"path": request.path, "body": body,
                                  "key": request.headers.get("x-goog-api-key")})
        text, calls = self.answer(model, body)
        parts = ([{"text": text}] if text else []) + [
            {"functionCall": {"name": n, "args": a}} for n, a in calls]
        if method == "streamGenerateContent" and "alt=sse" in query:
            # Every event holds a part, the last one the finish reason (as the API
            # streams; google-genai's chats drop an answer with an empty event).
            pieces = []
            if text:
                half = len(text) // 2
                pieces += [{"text": text[:half]}, {"text": text[half:]}]
            pieces += [c for c in parts if "functionCall" in c]
            events = [chunk([p], finish=i == len(pieces) - 1) for i, p in enumerate(pieces)]
            data = [f"data: {json.dumps(e)}\r\n\r\n" for e in events]
            # The text first, then a pause: the proxy passes text on as it comes, so
            # that a stop decided on the call after it is the stream's last event.
            cut = 2 if text else 0
            self.reply(request, ["".join(data[:cut]), "".join(data[cut:])], "text/event-stream")
        else:
            self.reply(request, [json.dumps(chunk(parts, finish=True))], "application/json")

    @property
    def base(self) -> str:
        return self.address

    def answer(self, model: str, body: dict):
        if model == "loop":
            return "Building.", [("bash", BUILD)]
        if model == "explore":
            done = sum(1 for c in body["contents"] for p in c.get("parts", [])
                       if "functionResponse" in p)
            if done >= FILES:
                return DONE, []
            return None, [("read_file", {"path": f"src/módulo_{done}.rs"})]
        raise AssertionError(f"no script for model {model}")



def chunk(parts: list[dict], finish: bool = False) -> dict:
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
    out = {"candidates": [candidate], "modelVersion": "gemini-test"}
    if finish:
        candidate["finishReason"] = "STOP"
        out["usageMetadata"] = {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5}
    return out




@pytest.fixture
def upstream():
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def proxy(loopctl, upstream, tmp_path):
    p = Proxy(loopctl, upstream.base, POLICY, tmp_path)
    yield p
    p.close()


def client(proxy: Proxy) -> genai.Client:
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=proxy.base))


def run(proxy: Proxy, model: str, turns: int, stream: bool) -> list[dict]:
    """An agent loop: each call answered with TOOL_OUTPUT (by name, as calls carry no id), an
    answer without a call with "Go on.", until DONE, `turns` answers, or an error. One record
    per answer."""
    c = client(proxy)
    config = types.GenerateContentConfig(
        tools=TOOLS, system_instruction="You are a build agent.",
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    history = [types.Content(role="user", parts=[types.Part(text="build the project")])]
    seen = []
    for _ in range(turns):
        record: dict = {}
        parts: list[types.Part] = []
        try:
            if stream:
                for piece in c.models.generate_content_stream(model=model, contents=history, config=config):
                    record["chunks"] = record.get("chunks", 0) + 1
                    if piece.candidates and piece.candidates[0].content:
                        parts += piece.candidates[0].content.parts or []
            else:
                r = c.models.generate_content(model=model, contents=history, config=config)
                record["headers"] = {k: v for k, v in r.sdk_http_response.headers.items()
                                     if k.startswith("x-loopguard-")}
                parts = list(r.candidates[0].content.parts or [])
                record["finish"] = r.candidates[0].finish_reason
        except errors.APIError as e:
            record["error"] = e
            record["text"] = "".join(p.text or "" for p in parts)
            seen.append(record)
            break
        calls = [p.function_call for p in parts if p.function_call]
        record["text"] = "".join(p.text or "" for p in parts if not p.function_call)
        record["calls"] = [(f.name, dict(f.args or {})) for f in calls]
        seen.append(record)
        if record["text"] == DONE:
            break
        history.append(types.Content(role="model", parts=parts))
        if not calls:
            history.append(types.Content(role="user", parts=[types.Part(text="Go on.")]))
            continue
        history.append(types.Content(role="user", parts=[
            types.Part.from_function_response(name=f.name, response={"output": TOOL_OUTPUT})
            for f in calls]))
    return seen


def responses_in(request: dict) -> list[dict]:
    """Every function response of a request the upstream received, in order."""
    return [p["functionResponse"]["response"] for c in request["body"]["contents"]
            for p in c.get("parts", []) if "functionResponse" in p]


def run_chat(proxy: Proxy, model: str, turns: int) -> tuple[list[dict], list]:
    """The same agent on a google-genai chat, streamed (`chats.create`, `send_message_stream`):
    the chat keeps each streamed piece of an answer as a content of its own. Returns a record
    per answer and the chat's history at the end."""
    c = client(proxy)
    config = types.GenerateContentConfig(
        tools=TOOLS, system_instruction="You are a build agent.",
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    chat = c.chats.create(model=model, config=config)
    message: object = "build the project"
    seen = []
    for _ in range(turns):
        record: dict = {"chunks": 0}
        parts: list[types.Part] = []
        try:
            for piece in chat.send_message_stream(message):
                record["chunks"] += 1
                if piece.candidates and piece.candidates[0].content:
                    parts += piece.candidates[0].content.parts or []
        except errors.APIError as e:
            record["error"] = e
            record["text"] = "".join(p.text or "" for p in parts)
            seen.append(record)
            break
        calls = [p.function_call for p in parts if p.function_call]
        record["text"] = "".join(p.text or "" for p in parts if not p.function_call)
        record["calls"] = [(f.name, dict(f.args or {})) for f in calls]
        seen.append(record)
        if record["text"] == DONE:
            break
        message = [types.Part.from_function_response(name=f.name, response={"output": TOOL_OUTPUT})
                   for f in calls] or "Go on."
    return seen, chat.get_history()


def test_a_streamed_chat_keeps_pieces_apart_and_is_judged_as_one_answer_each(proxy, upstream):
    seen, history = run_chat(proxy, "loop", 8)
    assert len(seen) == 5, seen
    for s in seen[:3]:
        assert s["calls"] == [("bash", BUILD)] and s["text"] == "Building.", s
    # The chat kept each piece of an answer as a content: the model saw runs of them.
    roles = [c["role"] for c in upstream.requests[1]["body"]["contents"]]
    assert roles == ["user", "model", "model", "model", "user"], roles
    outputs = [o["output"] for o in responses_in(upstream.requests[3])]
    assert outputs == [TOOL_OUTPUT, TOOL_OUTPUT, f"{TOOL_OUTPUT}\n\n{NUDGE}"], outputs
    assert seen[3]["calls"] == [], seen[3]
    assert seen[3]["text"].startswith("Building.[loopguard] Refused: bash called 4 times"), seen[3]
    e = seen[4]["error"]
    assert isinstance(e, errors.ClientError) and e.status == "FAILED_PRECONDITION", repr(e)
    assert e.details["error"]["loopguard"]["detector"] == "exact_repeat"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_healthy_conversation_is_untouched(proxy, upstream, stream):
    seen = run(proxy, "explore", 10, stream)
    assert [s["calls"] for s in seen[:FILES]] == [
        [("read_file", {"path": f"src/módulo_{i}.rs"})] for i in range(FILES)]
    assert seen[-1]["text"] == DONE, seen
    assert len(upstream.requests) == FILES + 1
    for s in seen:
        assert s.get("headers", {}) == {}, s
    # What the model got: the client's requests, unchanged, with its key, on its path.
    for r in upstream.requests:
        assert "[loopguard]" not in json.dumps(r["body"], ensure_ascii=False)
        assert r["key"] == KEY
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        # The client's default API version, `v1`: the proxy serves `/v1beta/models/…` too.
        assert r["path"] == f"/v1/models/explore:{method}", r["path"]
    assert all(o == {"output": TOOL_OUTPUT} for o in responses_in(upstream.requests[-1]))


def test_a_looping_run_is_warned_refused_then_stopped_the_same_way_streamed_or_not(loopctl, tmp_path):
    stops = []
    for stream in (False, True):
        up = Upstream()
        d = tmp_path / str(stream)
        d.mkdir()
        p = Proxy(loopctl, up.base, POLICY, d)
        try:
            seen = run(p, "loop", 8, stream)
            assert len(seen) == 5, seen
            for s in seen[:3]:
                assert s["calls"] == [("bash", BUILD)], s
                assert s["text"] == "Building."
            if not stream:
                assert seen[1]["headers"] == {}
                assert seen[2]["headers"]["x-loopguard-action"] == "warn", seen[2]
                assert seen[3]["headers"]["x-loopguard-action"] == "block", seen[3]
            else:
                assert seen[0]["chunks"] >= 2, "streamed in pieces"
            # The warning reached the model in the 3rd call's function response (4th request).
            outputs = [o["output"] for o in responses_in(up.requests[3])]
            assert outputs == [TOOL_OUTPUT, TOOL_OUTPUT, f"{TOOL_OUTPUT}\n\n{NUDGE}"], outputs
            assert all(o["output"] == TOOL_OUTPUT for o in responses_in(up.requests[2]))
            # The refusal: no call to run, the model's text says why.
            refused = seen[3]
            assert refused["calls"] == [], refused
            assert refused["text"].startswith("Building.[loopguard] Refused: bash called 4 times"), refused
            # The stop: the error the client raises for Gemini's own errors.
            e = seen[4]["error"]
            assert isinstance(e, errors.ClientError), repr(e)
            assert e.code == 400 and e.status == "FAILED_PRECONDITION", repr(e)
            body = e.details["error"]
            assert body["details"][0]["reason"] == "tool_loop_terminated", body
            assert body["loopguard"]["detector"] == "exact_repeat", body
            assert body["loopguard"]["tool"] == "bash", body
            if stream:
                # Text had been streamed: the stop was the stream's last event.
                assert seen[4]["text"] == "Building.", seen[4]
            stops.append((type(e), e.code, e.status, body["details"][0]["reason"]))
            assert KEY not in p.log()
        finally:
            p.close()
            up.close()
    assert stops[0] == stops[1], stops
