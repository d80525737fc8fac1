"""A small agent loop on the official `openai` client, pointed at `loopctl proxy`.

It asks the model, runs every tool call it is given (the tool's output is fixed: the build
always fails), sends the results back and asks again, for a number of turns or until the
client raises an error. Each turn is printed on stdout as one JSON line: what the client
library handed the agent (text, tool calls, finish reason) or the error it raised. The Rust
end-to-end tests (tests/tests/proxy_openai.rs) read these lines.

Usage: agent.py --base URL --session ID --model NAME --turns N [--stream]
"""

import argparse
import json
import sys

try:
    import openai
except ImportError:
    print(
        "the `openai` Python package is not installed: run "
        "`python3 -m pip install openai` (.ci/run installs the pinned version)",
        file=sys.stderr,
    )
    sys.exit(2)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]

TOOL_OUTPUT = "error: could not compile `app`"


def ask(client, args, messages):
    """One turn, non-streaming: (content, calls, finish_reason)."""
    resp = client.chat.completions.create(
        model=args.model,
        messages=messages,
        tools=TOOLS,
        extra_headers={"X-Session-Id": args.session},
    )
    choice = resp.choices[0]
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in (choice.message.tool_calls or [])
    ]
    return choice.message.content, calls, choice.finish_reason, 1


def ask_stream(client, args, messages):
    """One turn, streaming, assembled the way agents do: (content, calls, finish_reason)."""
    stream = client.chat.completions.create(
        model=args.model,
        messages=messages,
        tools=TOOLS,
        stream=True,
        extra_headers={"X-Session-Id": args.session},
    )
    content = None
    calls = {}
    finish = None
    chunks = 0
    for chunk in stream:
        chunks += 1
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content is not None:
            content = (content or "") + delta.content
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                call["id"] = tc.id
            if tc.function is not None:
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
        if choice.finish_reason is not None:
            finish = choice.finish_reason
    return content, [calls[i] for i in sorted(calls)], finish, chunks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base, api_key="sk-test", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "build the project"}]
    for turn in range(1, args.turns + 1):
        try:
            if args.stream:
                content, calls, finish, chunks = ask_stream(client, args, messages)
            else:
                content, calls, finish, chunks = ask(client, args, messages)
        except openai.APIError as e:
            print(
                json.dumps(
                    {
                        "turn": turn,
                        "error": {
                            "class": type(e).__name__,
                            "status": getattr(e, "status_code", None),
                            "message": e.message,
                            "code": e.code,
                            "type": e.type,
                            "body": e.body,
                        },
                    }
                ),
                flush=True,
            )
            return 0
        print(
            json.dumps(
                {
                    "turn": turn,
                    "content": content,
                    "tool_calls": calls,
                    "finish_reason": finish,
                    "chunks": chunks,
                }
            ),
            flush=True,
        )
        assistant = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        messages.append(assistant)
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": TOOL_OUTPUT})
    return 0


if __name__ == "__main__":
    sys.exit(main())
