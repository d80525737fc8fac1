"""A small agent loop on the official `anthropic` client, pointed at `loopctl proxy`.

It asks the model, runs every tool call it is given (the tool's output is fixed: the build
always fails), sends the results back and asks again, for a number of turns or until the
client raises an error; a turn without calls is answered "Go on.". Each turn is printed on
stdout as one JSON line: what the client library handed the agent (text blocks, tool calls,
stop reason, the `x-loopguard-*` headers, the `loopguard` field the proxy adds), the request
it sent, or the error it raised. The Rust end-to-end tests (tests/tests/proxy_anthropic.rs)
read these lines.

Modes: `plain` (`messages.with_raw_response.create`), `stream` (the `messages.stream` helper)
and `events` (`messages.with_raw_response.create(stream=True)`, the raw events assembled here).

The API key goes where the client puts it (this version: `Authorization: Bearer`), or with
`--x-api-key` in the `x-api-key` header alone, as older clients and plain HTTP callers send it.

Usage: agent_anthropic.py --base URL --session ID --model NAME --turns N
       [--mode plain|stream|events] [--no-header] [--x-api-key]
"""

import argparse
import json
import sys

try:
    import anthropic
except ImportError:
    print(
        "the `anthropic` Python package is not installed: run "
        "`python3 -m pip install anthropic` (scripts/test installs the pinned version)",
        file=sys.stderr,
    )
    sys.exit(2)

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
]

TOOL_OUTPUT = "error: could not compile `app`"
API_KEY = "sk-ant-test"
# The request headers that must reach the upstream as the client sent them.
FORWARDED = ("authorization", "x-api-key", "anthropic-version")


def loopguard_headers(headers):
    """The proxy's `x-loopguard-*` headers of a response."""
    return {k: v for k, v in headers.items() if k.lower().startswith("x-loopguard-")}


def sent_headers(request):
    """The headers of `FORWARDED` that the client sent with `request`."""
    return {k: request.headers[k] for k in FORWARDED if k in request.headers}


def extra(model, key):
    """A field the client kept beside the ones it knows (`None` when absent)."""
    return (getattr(model, "model_extra", None) or {}).get(key)


def block_dict(block):
    """A content block as the agent sends it back."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    raise ValueError(f"unexpected block type {block.type}")


def ask(client, params, extra_headers):
    """One turn, whole: (blocks, stop reason, headers, loopguard field, turn details)."""
    raw = client.messages.with_raw_response.create(**params, extra_headers=extra_headers)
    message = raw.parse()
    blocks = [block_dict(b) for b in message.content]
    details = {
        "id": message.id,
        "body": json.loads(raw.http_response.text),
        "sent_headers": sent_headers(raw.http_response.request),
    }
    return blocks, message.stop_reason, raw.headers, extra(message, "loopguard"), details


def ask_stream(client, params, extra_headers):
    """One turn through the `messages.stream` helper, its final message accumulated by it."""
    loopguard = None
    events = 0
    text_events = 0
    with client.messages.stream(**params, extra_headers=extra_headers) as stream:
        headers = stream.response.headers
        request = stream.response.request
        for event in stream:
            events += 1
            if event.type == "text":
                text_events += 1
            if event.type == "message_delta":
                loopguard = extra(event, "loopguard")
        message = stream.get_final_message()
    blocks = [block_dict(b) for b in message.content]
    details = {
        "id": message.id,
        "events": events,
        "text_events": text_events,
        "sent_headers": sent_headers(request),
    }
    return blocks, message.stop_reason, headers, loopguard, details


def ask_events(client, params, extra_headers):
    """One turn with `stream=True`, its raw events assembled the way agents do."""
    raw = client.messages.with_raw_response.create(
        **params, stream=True, extra_headers=extra_headers
    )
    blocks = {}
    partial = {}
    stop_reason = None
    loopguard = None
    message_id = None
    events = 0
    text_events = 0
    for event in raw.parse():
        events += 1
        if event.type == "message_start":
            message_id = event.message.id
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "text":
                blocks[event.index] = {"type": "text", "text": block.text}
            elif block.type == "tool_use":
                blocks[event.index] = {
                    "type": "tool_use",
                    "id": block.id,
                    "name": block.name,
                    "input": block.input,
                }
                partial[event.index] = ""
        elif event.type == "content_block_delta":
            if event.delta.type == "text_delta":
                text_events += 1
                blocks[event.index]["text"] += event.delta.text
            elif event.delta.type == "input_json_delta":
                partial[event.index] += event.delta.partial_json
        elif event.type == "content_block_stop":
            if partial.get(event.index):
                blocks[event.index]["input"] = json.loads(partial[event.index])
        elif event.type == "message_delta":
            stop_reason = event.delta.stop_reason
            loopguard = extra(event, "loopguard")
    details = {
        "id": message_id,
        "events": events,
        "text_events": text_events,
        "sent_headers": sent_headers(raw.http_response.request),
    }
    ordered = [blocks[i] for i in sorted(blocks)]
    return ordered, stop_reason, raw.headers, loopguard, details


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--mode", choices=["plain", "stream", "events"], default="plain")
    parser.add_argument("--no-header", action="store_true", help="send no X-Session-Id")
    parser.add_argument("--x-api-key", action="store_true", help="the key in x-api-key alone")
    args = parser.parse_args()

    default_headers = None
    if args.x_api_key:
        default_headers = {"x-api-key": API_KEY, "Authorization": anthropic.Omit()}
    client = anthropic.Anthropic(
        base_url=args.base,
        api_key=API_KEY,
        default_headers=default_headers,
        max_retries=0,
        timeout=30,
    )
    extra_headers = {} if args.no_header else {"X-Session-Id": args.session}
    ask_turn = {"plain": ask, "stream": ask_stream, "events": ask_events}[args.mode]
    messages = [{"role": "user", "content": "build the project"}]
    for turn in range(1, args.turns + 1):
        params = {
            "model": args.model,
            "max_tokens": 1024,
            "system": f"You are a coding agent ({args.session}).",
            "messages": messages,
            "tools": TOOLS,
        }
        sent = json.loads(json.dumps(params))
        try:
            blocks, stop_reason, headers, loopguard, details = ask_turn(
                client, params, extra_headers
            )
        except anthropic.APIError as e:
            response = getattr(e, "response", None)
            body = e.body
            error = body.get("error") if isinstance(body, dict) else None
            print(
                json.dumps(
                    {
                        "turn": turn,
                        "sent": sent,
                        "error": {
                            "class": type(e).__name__,
                            "status": getattr(e, "status_code", None),
                            "message": e.message,
                            "type": getattr(e, "type", None),
                            "code": error.get("code") if isinstance(error, dict) else None,
                            "body": body,
                            "headers": loopguard_headers(response.headers) if response else {},
                        },
                        "sent_headers": sent_headers(e.request),
                    }
                ),
                flush=True,
            )
            return 0
        calls = [b for b in blocks if b["type"] == "tool_use"]
        line = {
            "turn": turn,
            "sent": sent,
            "text": [b["text"] for b in blocks if b["type"] == "text"],
            "tool_calls": [{k: c[k] for k in ("id", "name", "input")} for c in calls],
            "stop_reason": stop_reason,
            "headers": loopguard_headers(headers),
            "loopguard": loopguard,
        }
        line.update(details)
        print(json.dumps(line), flush=True)
        messages = messages + [{"role": "assistant", "content": blocks}]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": c["id"], "content": TOOL_OUTPUT}
                for c in calls
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": "Go on."})
    return 0


if __name__ == "__main__":
    sys.exit(main())
