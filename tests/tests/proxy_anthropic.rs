#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` driven by the official `anthropic` Python client
//! (`tests/python/agent_anthropic.py`, a small agent loop), between the client and a scripted
//! Anthropic Messages upstream on 127.0.0.1: a looping conversation is warned, then refused,
//! then stopped, and a conversation that does not loop reaches the client unchanged, whole and
//! streamed (the client's `messages.stream` helper and its raw `stream=True` events).

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::messages::tool_use_id;
use support::*;

/// The agent on the official client, at the version `scripts/test` installs.
const AGENT: PythonAgent = PythonAgent {
    script: "agent_anthropic.py",
    package: "anthropic",
    pin: "2.13.0",
    base_path: "",
};

const TOOL_OUTPUT: &str = "error: could not compile `app`";
const NUDGE: &str = "[loopguard] Loop detected: bash called 3 times with the same arguments. \
                     Change your approach.";

/// What the agent saw, turn by turn (one JSON object per turn, as `agent_anthropic.py` prints
/// them).
async fn agent(
    proxy: &Arc<Proxy>,
    session: &str,
    model: &str,
    turns: u32,
    mode: &str,
    extra: &[&str],
) -> Vec<Value> {
    let turns = turns.to_string();
    let mut args = vec![
        "--session",
        session,
        "--model",
        model,
        "--turns",
        &turns,
        "--mode",
        mode,
    ];
    args.extend_from_slice(extra);
    python_agent(proxy, AGENT, &args).await
}

/// The `tool_result` block answering `id` in a request the upstream received.
fn result_of<'a>(request: &'a Value, id: &str) -> &'a Value {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id} in {request}"))
}

/// The upstream received exactly what the client sent (with `stream: true` when streamed),
/// but for the nudges in `nudged` (call id → the result's content as the model got it).
fn assert_forwarded(turns: &[Value], received: &[Received], stream: bool, nudged: &[(&str, &str)]) {
    assert_eq!(
        turns.len(),
        received.len(),
        "every turn asked the model once"
    );
    for (t, r) in turns.iter().zip(received) {
        let mut expected = t["sent"].clone();
        if stream {
            expected["stream"] = json!(true);
        }
        for m in expected["messages"].as_array_mut().unwrap() {
            for b in m["content"].as_array_mut().into_iter().flatten() {
                if let Some((_, content)) = nudged.iter().find(|(id, _)| b["tool_use_id"] == *id) {
                    b["content"] = json!(content);
                }
            }
        }
        assert_eq!(r.body, expected, "turn {}", t["turn"]);
        assert_eq!(r.status, 200, "{:?}", r.answer);
        // The client's credential and API version reach the upstream as it sent them; the
        // session header is the proxy's own.
        let sent = t["sent_headers"].as_object().unwrap();
        assert!(sent.contains_key("anthropic-version"), "{t}");
        assert!(
            sent.contains_key("authorization") || sent.contains_key("x-api-key"),
            "{t}"
        );
        for k in ["authorization", "x-api-key", "anthropic-version"] {
            let got = r.headers.get(k).map(|v| json!(v.to_str().unwrap()));
            assert_eq!(got.as_ref(), sent.get(k), "{k}: {:?}", r.headers);
        }
        assert_eq!(r.headers.get("x-session-id"), None);
    }
}

/// The ladder as the client library sees it: three released calls (the 3rd warned: the nudge
/// reaches the model with its result), the 4th refused as a well-formed text turn, the 5th an
/// error the library raises (`mid_stream`: after text was streamed, the stream's last event).
fn assert_looping_conversation(turns: &[Value], received: &[Received], mode: &str) {
    let plain = mode == "plain";
    assert_eq!(turns.len(), 5, "stopped at the 5th turn: {turns:#?}");
    for (i, t) in turns[..3].iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(t["stop_reason"], "tool_use", "{t}");
        assert_eq!(t["text"], json!(["Building."]), "{t}");
        assert_eq!(
            t["tool_calls"],
            json!([{"id": tool_use_id(n), "name": "bash", "input": {"command": "cargo build"}}]),
            "{t}"
        );
        if !plain {
            assert!(t["text_events"].as_u64().unwrap() >= 3, "streamed: {t}");
        }
    }
    for t in &turns[..2] {
        assert_eq!(t["headers"], json!({}), "{t}");
        assert_eq!(t["loopguard"], Value::Null, "{t}");
    }
    // The warning: on the 3rd turn's message, and in the 3rd call's result in the 4th request.
    let warned = &turns[2];
    let w = &warned["loopguard"]["interventions"];
    assert_eq!(w[0]["action"], "warn", "{warned}");
    assert_eq!(w[0]["detector"], "exact_repeat", "{warned}");
    assert_eq!(w[0]["tool_call_id"], tool_use_id(3), "{warned}");
    if plain {
        assert_eq!(warned["headers"]["x-loopguard-action"], "warn", "{warned}");
        assert_eq!(
            warned["headers"]["x-loopguard-detector"], "exact_repeat",
            "{warned}"
        );
    }
    let nudged = format!("{TOOL_OUTPUT}\n\n{NUDGE}");
    assert_eq!(
        result_of(&received[3].body, &tool_use_id(3))["content"],
        nudged
    );
    assert_eq!(
        result_of(&received[2].body, &tool_use_id(2))["content"],
        TOOL_OUTPUT,
        "no nudge before the 3rd call"
    );
    // The refusal: no call for the client to run, a stop reason that says so, the refusal as
    // marked text after the model's own.
    let refused = &turns[3];
    assert_eq!(refused["tool_calls"], json!([]), "{refused}");
    assert_eq!(refused["stop_reason"], "end_turn", "{refused}");
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
    assert_eq!(b[0]["tool_call_id"], tool_use_id(4), "{refused}");
    if plain {
        assert_eq!(
            refused["headers"]["x-loopguard-action"], "block",
            "{refused}"
        );
        assert!(
            refused["headers"]["x-loopguard-rule"]
                .as_str()
                .unwrap()
                .contains("ladders.default"),
            "{refused}"
        );
    }
    // The stop: an error the library raises, naming the tool, the count and what to change.
    let e = &turns[4]["error"];
    if plain {
        assert_eq!(e["class"], "BadRequestError", "{e}");
        assert_eq!(e["status"], 400, "{e}");
        assert_eq!(e["headers"]["x-loopguard-action"], "terminate", "{e}");
    } else {
        // The text was already streamed: the stream's last event, which the client raises
        // as an error of the (200) stream.
        assert_eq!(
            e["class"], "APIStatusError",
            "a mid-stream error event: {e}"
        );
        assert_eq!(e["status"], 200, "{e}");
    }
    assert_eq!(e["type"], "loop_detected", "{e}");
    assert_eq!(e["code"], "tool_loop_terminated", "{e}");
    assert_eq!(e["body"]["type"], "error", "Anthropic's envelope: {e}");
    let message = e["body"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("`bash`, 5 times"), "{message}");
    assert_eq!(e["body"]["error"]["loopguard"]["tool"], "bash", "{e}");
    assert_forwarded(
        turns,
        received,
        !plain,
        &[(&tool_use_id(3), nudged.as_str())],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_client_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let turns = agent(&p, "anthropic-loop", "loop", 8, "plain", &[]).await;
    assert_looping_conversation(&turns, &up.received("messages"), "plain");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_stream_helper_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let turns = agent(&p, "anthropic-loop-stream", "loop", 8, "stream", &[]).await;
    assert_looping_conversation(&turns, &up.received("messages"), "stream");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_raw_stream_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    // No session header: the proxy names the session from the system prompt and the first
    // message, within the caller's key, here in `x-api-key`.
    let extra = ["--no-header", "--x-api-key"];
    let turns = agent(&p, "anthropic-loop-events", "loop", 8, "events", &extra).await;
    assert_eq!(turns[0]["sent_headers"]["x-api-key"], "sk-ant-test");
    assert_looping_conversation(&turns, &up.received("messages"), "events");
}

/// A stop decided before anything of the stream was sent is the same 400 as without
/// streaming, headers included.
#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_stream_stopped_before_it_started_is_the_same_400() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let mut errors = Vec::new();
    for mode in ["plain", "stream", "events"] {
        let turns = agent(&p, &format!("quiet-{mode}"), "quietloop", 8, mode, &[]).await;
        assert_eq!(turns.len(), 5, "{mode}: {turns:#?}");
        assert_eq!(turns[3]["tool_calls"], json!([]), "{mode}");
        assert_eq!(
            turns[3]["loopguard"]["interventions"][0]["action"], "block",
            "{mode}"
        );
        let note = turns[3]["text"][0].as_str().unwrap();
        assert!(note.starts_with("[loopguard] Refused:"), "{mode}: {note}");
        let e = turns[4]["error"].clone();
        assert_eq!(e["class"], "BadRequestError", "{mode}: {e}");
        assert_eq!(e["status"], 400, "{mode}: {e}");
        assert_eq!(e["code"], "tool_loop_terminated", "{mode}: {e}");
        assert_eq!(
            e["headers"]["x-loopguard-action"], "terminate",
            "{mode}: {e}"
        );
        assert_eq!(
            e["headers"]["x-loopguard-detector"], "exact_repeat",
            "{mode}: {e}"
        );
        errors.push(e);
    }
    let shape = |e: &Value| {
        (
            e["status"].clone(),
            e["body"]["error"]["type"].clone(),
            e["code"].clone(),
        )
    };
    assert_eq!(shape(&errors[0]), shape(&errors[1]));
    assert_eq!(shape(&errors[0]), shape(&errors[2]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_that_does_not_loop_reaches_the_anthropic_client_unchanged() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    let mut all = Vec::new();
    for mode in ["plain", "stream", "events"] {
        let plain = mode == "plain";
        // The key as the client sends it, and in `x-api-key` for whole messages.
        let extra: &[&str] = if plain { &["--x-api-key"] } else { &[] };
        // Text only: multi-byte characters, escapes, markdown, whitespace, byte for byte.
        let turns = agent(&p, &format!("rich-{mode}"), "rich", 1, mode, extra).await;
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0]["text"], json!([RICH]), "{mode}");
        assert_eq!(turns[0]["stop_reason"], "end_turn", "{mode}");
        if !plain {
            assert!(
                turns[0]["text_events"].as_u64().unwrap() >= 3,
                "{mode}: {}",
                turns[0]
            );
        }
        all.extend(turns);
        // A working agent: a new file every turn, with text and non-ASCII arguments.
        let turns = agent(&p, &format!("explore-{mode}"), "explore", 6, mode, extra).await;
        assert_eq!(turns.len(), 6);
        let first = all.len() as u64 + 1;
        for (i, t) in turns.iter().enumerate() {
            let n = first + i as u64;
            let input: Value = serde_json::from_str(&explore_arguments(n)).unwrap();
            assert_eq!(t["text"], json!(["Reading the next file."]), "{mode}: {t}");
            assert_eq!(t["stop_reason"], "tool_use", "{t}");
            assert_eq!(
                t["tool_calls"],
                json!([{"id": tool_use_id(n), "name": "read_file", "input": input}]),
                "{mode}"
            );
        }
        all.extend(turns);
    }
    let received = up.received("messages");
    assert_eq!(received.len(), all.len());
    for (t, r) in all.iter().zip(&received) {
        assert_eq!(t["headers"], json!({}), "{t}");
        assert_eq!(t["loopguard"], Value::Null, "{t}");
        // A whole message reaches the client as the upstream wrote it.
        if let Some(body) = t.get("body") {
            assert_eq!(Some(body), r.answer.as_ref(), "{t}");
        }
    }
    // Nothing was added on the way to the model either.
    let (plain, streamed) = (&all[..7], &all[7..]);
    assert_forwarded(plain, &received[..7], false, &[]);
    assert_forwarded(streamed, &received[7..], true, &[]);
    let m = support::metrics(&p).await;
    assert!(!m.contains("loopguard_proxy_interventions_total{"), "{m}");
}
