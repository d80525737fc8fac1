#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` driven by the official `openai` Python client's Responses API
//! (`tests/python/agent_responses.py`, a small agent loop), between the client and a scripted
//! Responses upstream on 127.0.0.1: a looping conversation is warned, then refused, then
//! stopped, and a conversation that does not loop reaches the client unchanged, whole and
//! streamed, each request continuing the previous response (`previous_response_id`) or
//! carrying the whole conversation.

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::responses::{call_id, response_id};
use support::*;

/// The agent on the official client, at the version `scripts/test` installs.
const AGENT: PythonAgent = PythonAgent {
    script: "agent_responses.py",
    package: "openai",
    pin: "3.54.0",
    base_path: "/v1",
};

const TOOL_OUTPUT: &str = "error: could not compile `app`";
const NUDGE: &str = "[loopguard] Loop detected: bash called 3 times with the same arguments. \
                     Change your approach.";

/// How the agent talks to the API.
#[derive(Clone, Copy, Debug)]
struct Mode {
    stream: bool,
    /// Each request continues the previous response (`previous_response_id`), with no session
    /// header: the proxy follows the chain. Otherwise the whole conversation, `store: false`.
    chain: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        stream: false,
        chain: true,
    },
    Mode {
        stream: true,
        chain: true,
    },
    Mode {
        stream: false,
        chain: false,
    },
    Mode {
        stream: true,
        chain: false,
    },
];

/// What the agent saw, turn by turn (one JSON object per turn, as `agent_responses.py` prints
/// them).
async fn agent(
    proxy: &Arc<Proxy>,
    session: &str,
    model: &str,
    turns: u32,
    mode: Mode,
) -> Vec<Value> {
    let turns = turns.to_string();
    let mut args = vec!["--session", session, "--model", model, "--turns", &turns];
    if mode.stream {
        args.push("--stream");
    }
    if mode.chain {
        args.extend(["--chain", "--no-header"]);
    }
    python_agent(proxy, AGENT, &args).await
}

/// The `function_call_output` answering `id` in a request the upstream received.
fn output_of<'a>(request: &'a Value, id: &str) -> &'a Value {
    request["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call_output" && i["call_id"] == id)
        .unwrap_or_else(|| panic!("no output for {id} in {request}"))
}

/// The upstream received exactly what the client sent (with `stream: true` when streamed),
/// but for the nudges in `nudged` (call id → the output as the model got it) and, when
/// `withheld` is given, the output the proxy adds at the start of that request's input for a
/// call it withheld from the response the request continues.
fn assert_forwarded(
    turns: &[Value],
    received: &[Received],
    mode: Mode,
    nudged: &[(&str, &str)],
    withheld: Option<(usize, &Value)>,
) {
    assert_eq!(
        turns.len(),
        received.len(),
        "every turn asked the model once"
    );
    for (i, (t, r)) in turns.iter().zip(received).enumerate() {
        let mut expected = t["sent"].clone();
        if mode.stream {
            expected["stream"] = json!(true);
        }
        let input = expected["input"].as_array_mut().unwrap();
        for item in input.iter_mut() {
            if let Some((_, output)) = nudged.iter().find(|(id, _)| item["call_id"] == *id)
                && item["type"] == "function_call_output"
            {
                item["output"] = json!(output);
            }
        }
        if let Some((at, output)) = withheld
            && at == i
        {
            input.insert(0, output.clone());
        }
        assert_eq!(r.body, expected, "turn {}", t["turn"]);
        assert_eq!(r.status, 200, "{:?}", r.answer);
        assert_eq!(
            r.headers.get("authorization").unwrap(),
            "Bearer sk-test",
            "the client's key reaches the upstream"
        );
        assert_eq!(r.headers.get("x-session-id"), None);
    }
}

/// A streamed turn delivered what its final response says, in events numbered densely from 0.
fn assert_stream_consistent(t: &Value) {
    assert_eq!(t["streamed_text"], t["text"], "{t}");
    assert_eq!(t["streamed_calls"], t["tool_calls"], "{t}");
    let seq: Vec<u64> = t["sequence_numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>(), "{t}");
}

/// The ladder as the client library sees it: three released calls (the 3rd warned: the nudge
/// reaches the model with its output), the 4th refused as a well-formed text turn (and, in a
/// chain, answered with the refusal in the request continuing it), the 5th an error the
/// library raises.
fn assert_looping_conversation(turns: &[Value], received: &[Received], mode: Mode) {
    assert_eq!(turns.len(), 5, "stopped at the 5th turn: {turns:#?}");
    for (i, t) in turns[..3].iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(t["id"], response_id(n), "{t}");
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(t["text"], json!(["Building."]), "{t}");
        assert_eq!(
            t["tool_calls"],
            json!([{"call_id": call_id(n), "name": "bash", "arguments": BUILD}]),
            "{t}"
        );
        if mode.stream {
            assert!(t["text_events"].as_u64().unwrap() >= 3, "streamed: {t}");
            assert_stream_consistent(t);
        }
    }
    for t in &turns[..2] {
        assert_eq!(t["headers"], json!({}), "{t}");
        assert_eq!(t["loopguard"], Value::Null, "{t}");
    }
    // The warning: on the 3rd response, and in the 3rd call's output in the 4th request.
    let warned = &turns[2];
    let w = &warned["loopguard"]["interventions"];
    assert_eq!(w[0]["action"], "warn", "{warned}");
    assert_eq!(w[0]["detector"], "exact_repeat", "{warned}");
    assert_eq!(w[0]["tool_call_id"], call_id(3), "{warned}");
    if !mode.stream {
        assert_eq!(warned["headers"]["x-loopguard-action"], "warn", "{warned}");
    }
    let nudged = format!("{TOOL_OUTPUT}\n\n{NUDGE}");
    assert_eq!(output_of(&received[3].body, &call_id(3))["output"], nudged);
    assert_eq!(
        output_of(&received[2].body, &call_id(2))["output"],
        TOOL_OUTPUT,
        "no nudge before the 3rd call"
    );
    // The refusal: no call for the client to run, the refusal as a marked message after the
    // model's own.
    let refused = &turns[3];
    assert_eq!(refused["tool_calls"], json!([]), "{refused}");
    assert_eq!(refused["status"], "completed", "{refused}");
    let text = refused["text"].as_array().unwrap();
    assert_eq!(text.len(), 2, "{refused}");
    assert_eq!(text[0], "Building.");
    let note = text[1].as_str().unwrap();
    assert!(
        note.starts_with("[loopguard] Refused: bash called 4 times"),
        "{note}"
    );
    let b = &refused["loopguard"]["interventions"];
    assert_eq!(b[0]["action"], "block", "{refused}");
    assert_eq!(b[0]["tool_call_id"], call_id(4), "{refused}");
    if mode.stream {
        assert_stream_consistent(refused);
    } else {
        assert_eq!(
            refused["headers"]["x-loopguard-action"], "block",
            "{refused}"
        );
        assert_eq!(
            refused["headers"]["x-loopguard-detector"], "exact_repeat",
            "{refused}"
        );
    }
    // The request after the refusal: continuing the stored response, it answers the call the
    // client never saw with the refusal (the upstream would refuse it otherwise).
    let withheld = json!({"type": "function_call_output", "call_id": call_id(4), "output": note});
    if mode.chain {
        assert_eq!(received[4].body["previous_response_id"], response_id(4));
        assert_eq!(received[4].body["input"][0], withheld);
    }
    // The stop: an error the library raises, naming the tool, the count and what to change.
    let e = &turns[4]["error"];
    if mode.stream {
        // The text was already streamed: the stream's last event.
        assert_eq!(e["class"], "APIError", "a mid-stream error event: {e}");
    } else {
        assert_eq!(e["class"], "BadRequestError", "{e}");
        assert_eq!(e["status"], 400, "{e}");
        assert_eq!(e["headers"]["x-loopguard-action"], "terminate", "{e}");
    }
    // The client keeps the error object as the body, either way.
    assert_eq!(e["type"], "loop_detected", "{e}");
    assert_eq!(e["code"], "tool_loop_terminated", "{e}");
    assert_eq!(e["body"]["loopguard"]["tool"], "bash", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("`bash`, 5 times"),
        "{e}"
    );
    assert_forwarded(
        turns,
        received,
        mode,
        &[(&call_id(3), nudged.as_str())],
        mode.chain.then_some((4, &withheld)),
    );
}

async fn looping(mode: Mode) {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let turns = agent(&p, "responses-loop", "loop", 8, mode).await;
    assert_looping_conversation(&turns, &up.received("responses"), mode);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_responses_chain_is_warned_then_refused_then_stopped() {
    looping(MODES[0]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_responses_chain_is_warned_then_refused_then_stopped() {
    looping(MODES[1]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_with_the_whole_input_are_warned_then_refused_then_stopped() {
    looping(MODES[2]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streamed_responses_with_the_whole_input_are_warned_then_refused_then_stopped() {
    looping(MODES[3]).await;
}

/// A stop decided before anything of the stream was sent is the same 400 as without
/// streaming, headers included.
#[tokio::test(flavor = "multi_thread")]
async fn a_responses_stream_stopped_before_it_started_is_the_same_400() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let mut errors = Vec::new();
    for mode in MODES {
        let session = format!("quiet-{}-{}", mode.stream, mode.chain);
        let turns = agent(&p, &session, "quietloop", 8, mode).await;
        assert_eq!(turns.len(), 5, "{mode:?}: {turns:#?}");
        assert_eq!(turns[3]["tool_calls"], json!([]), "{mode:?}");
        let note = turns[3]["text"][0].as_str().unwrap();
        assert!(note.starts_with("[loopguard] Refused:"), "{mode:?}: {note}");
        let e = turns[4]["error"].clone();
        assert_eq!(e["class"], "BadRequestError", "{mode:?}: {e}");
        assert_eq!(e["status"], 400, "{mode:?}: {e}");
        assert_eq!(e["code"], "tool_loop_terminated", "{mode:?}: {e}");
        assert_eq!(
            e["headers"]["x-loopguard-action"], "terminate",
            "{mode:?}: {e}"
        );
        errors.push(e);
    }
    let shape = |e: &Value| (e["status"].clone(), e["type"].clone(), e["code"].clone());
    for e in &errors[1..] {
        assert_eq!(shape(e), shape(&errors[0]));
    }
    // No request was refused by the upstream: every withheld call was answered.
    assert!(up.received("responses").iter().all(|r| r.status == 200));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_that_does_not_loop_reaches_the_responses_client_unchanged() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let mut n = 0;
    for mode in MODES {
        let first = up.received("responses").len();
        let name = format!("{}-{}", mode.stream, mode.chain);
        // Text only: multi-byte characters, escapes, markdown, whitespace, byte for byte.
        let mut turns = agent(&p, &format!("rich-{name}"), "rich", 1, mode).await;
        n += 1;
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0]["text"], json!([RICH]), "{mode:?}");
        assert_eq!(turns[0]["tool_calls"], json!([]), "{mode:?}");
        if mode.stream {
            assert!(
                turns[0]["text_events"].as_u64().unwrap() >= 3,
                "{}",
                turns[0]
            );
        }
        // A working agent: a new file every turn, with text and non-ASCII arguments.
        let explore = agent(&p, &format!("explore-{name}"), "explore", 6, mode).await;
        assert_eq!(explore.len(), 6);
        for t in &explore {
            n += 1;
            assert_eq!(t["id"], response_id(n), "{mode:?}: {t}");
            assert_eq!(
                t["text"],
                json!(["Reading the next file."]),
                "{mode:?}: {t}"
            );
            assert_eq!(
                t["tool_calls"],
                json!([{"call_id": call_id(n), "name": "read_file", "arguments": explore_arguments(n)}]),
                "{mode:?}"
            );
        }
        turns.extend(explore);
        let received = up.received("responses");
        let received = &received[first..];
        for (t, r) in turns.iter().zip(received) {
            assert_eq!(t["headers"], json!({}), "{t}");
            assert_eq!(t["loopguard"], Value::Null, "{t}");
            assert_eq!(t["status"], "completed", "{t}");
            if mode.stream {
                assert_stream_consistent(t);
            } else {
                // A whole response reaches the client as the upstream wrote it.
                assert_eq!(Some(&t["body"]), r.answer.as_ref(), "{t}");
            }
        }
        // Nothing was added on the way to the model either.
        assert_forwarded(&turns, received, mode, &[], None);
    }
    let m = support::metrics(&p).await;
    assert!(!m.contains("loopguard_proxy_interventions_total{"), "{m}");
}
