"""A small agent loop on the official `openai` client's Responses API, pointed at `loopctl proxy`.

It asks the model, runs every function call it is given (the tool's output is fixed: the build
always fails), sends the outputs back and asks again, for a number of turns or until the
client raises an error; a turn without calls is answered "Go on.". Each turn is printed on
stdout as one JSON line: what the client library handed the agent (text, function calls,
status, the `x-loopguard-*` headers, the `loopguard` field the proxy adds), the request it
sent, or the error it raised. The Rust end-to-end tests (tests/tests/proxy_responses.rs) read
these lines.

`--chain`: each request continues the previous response (`previous_response_id`) and sends only
what is new; otherwise every request sends the whole conversation as `input`, with
`store: false`. `--stream`: `responses.with_raw_response.create(stream=True)`, the events
assembled here.

Usage: agent_responses.py --base URL --session ID --model NAME --turns N
       [--stream] [--chain] [--no-header]
"""

import argparse
import json
import sys

try:
    import openai
except ImportError:
    print(
        "the `openai` Python package is not installed: run "
        "`python3 -m pip install openai` (scripts/test installs the pinned version)",
        file=sys.stderr,
    )
    sys.exit(2)

TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
]

TOOL_OUTPUT = "error: could not compile `app`"


def loopguard_headers(headers):
    """The proxy's `x-loopguard-*` headers of a response."""
    return {k: v for k, v in headers.items() if k.lower().startswith("x-loopguard-")}


def extra(model, key):
    """A field the client kept beside the ones it knows (`None` when absent)."""
    return (getattr(model, "model_extra", None) or {}).get(key)


def summary(response):
    """What the agent reads of a response: its text, in order, and its function calls."""
    texts = []
    calls = []
    for item in response.output:
        if item.type == "message":
            texts.append("".join(p.text for p in item.content if p.type == "output_text"))
        elif item.type == "function_call":
            calls.append({"call_id": item.call_id, "name": item.name, "arguments": item.arguments})
    return texts, calls


def ask(client, params, extra_headers):
    """One turn, whole."""
    raw = client.responses.with_raw_response.create(**params, extra_headers=extra_headers)
    response = raw.parse()
    texts, calls = summary(response)
    details = {"body": json.loads(raw.http_response.text)}
    return response, texts, calls, raw.headers, details


def ask_stream(client, params, extra_headers):
    """One turn, streamed: the text and calls as the events delivered them, and the final
    response of `response.completed`."""
    raw = client.responses.with_raw_response.create(
        **params, stream=True, extra_headers=extra_headers
    )
    deltas = {}
    done_items = []
    response = None
    events = 0
    text_events = 0
    sequence = []
    for event in raw.parse():
        events += 1
        sequence.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text_events += 1
            deltas[event.output_index] = deltas.get(event.output_index, "") + event.delta
        elif event.type == "response.output_item.done":
            done_items.append(event.item)
        elif event.type == "response.completed":
            response = event.response
    texts, calls = summary(response)
    streamed_calls = [
        {"call_id": i.call_id, "name": i.name, "arguments": i.arguments}
        for i in done_items
        if i.type == "function_call"
    ]
    details = {
        "events": events,
        "text_events": text_events,
        "streamed_text": [deltas[i] for i in sorted(deltas)],
        "streamed_calls": streamed_calls,
        "sequence_numbers": sequence,
    }
    return response, texts, calls, raw.headers, details


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--chain", action="store_true", help="use previous_response_id")
    parser.add_argument("--no-header", action="store_true", help="send no X-Session-Id")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base, api_key="sk-test", max_retries=0, timeout=30)
    extra_headers = {} if args.no_header else {"X-Session-Id": args.session}
    conversation = [{"role": "user", "content": "build the project"}]
    new = list(conversation)
    previous = None
    for turn in range(1, args.turns + 1):
        params = {
            "model": args.model,
            "instructions": f"You are a coding agent ({args.session}).",
            "tools": TOOLS,
        }
        if args.chain:
            params["input"] = new
            if previous is not None:
                params["previous_response_id"] = previous
        else:
            params["input"] = conversation
            params["store"] = False
        sent = json.loads(json.dumps(params))
        try:
            if args.stream:
                response, texts, calls, headers, details = ask_stream(client, params, extra_headers)
            else:
                response, texts, calls, headers, details = ask(client, params, extra_headers)
        except openai.APIError as e:
            response = getattr(e, "response", None)
            print(
                json.dumps(
                    {
                        "turn": turn,
                        "sent": sent,
                        "error": {
                            "class": type(e).__name__,
                            "status": getattr(e, "status_code", None),
                            "message": e.message,
                            "code": e.code,
                            "type": e.type,
                            "body": e.body,
                            "headers": loopguard_headers(response.headers) if response else {},
                        },
                    }
                ),
                flush=True,
            )
            return 0
        line = {
            "turn": turn,
            "sent": sent,
            "id": response.id,
            "status": response.status,
            "text": texts,
            "tool_calls": calls,
            "headers": loopguard_headers(headers),
            "loopguard": extra(response, "loopguard"),
        }
        line.update(details)
        print(json.dumps(line), flush=True)
        previous = response.id
        new = []
        for text in texts:
            conversation.append({"role": "assistant", "content": text})
        for c in calls:
            conversation.append({"type": "function_call", **c})
        for c in calls:
            new.append({"type": "function_call_output", "call_id": c["call_id"], "output": TOOL_OUTPUT})
        if not calls:
            new.append({"role": "user", "content": "Go on."})
        conversation.extend(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
