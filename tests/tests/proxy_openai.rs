#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` driven by the official `openai` Python client (`tests/python/agent.py`, a
//! small agent loop), between the client and a scripted upstream on 127.0.0.1: a looping
//! conversation is warned, then refused, then stopped, and a conversation that does not loop
//! reaches the client unchanged, streaming and not.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::*;

/// What the agent saw, turn by turn (one JSON object per turn, as `agent.py` prints them).
fn run_agent(proxy: &Proxy, session: &str, model: &str, turns: u32, stream: bool) -> Vec<Value> {
    let root = loopguard_tests::root();
    let check = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .expect("python3 must be installed to run the openai client tests");
    assert!(
        check.status.success(),
        "the `openai` Python package is missing: run `python3 -m pip install openai==3.54.0` \
         (.ci/run does)\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let base = format!("{}/v1", proxy.url(""));
    let mut cmd = Command::new("python3");
    cmd.current_dir(&root)
        .arg(root.join("tests/python/agent.py"))
        .args(["--base", &base, "--session", session, "--model", model])
        .args(["--turns", &turns.to_string()]);
    if stream {
        cmd.arg("--stream");
    }
    let out = cmd.output().expect("run tests/python/agent.py");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "agent.py failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nproxy log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        proxy.log()
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Runs the agent off the async runtime (the upstream is served on it meanwhile).
async fn agent(
    proxy: &std::sync::Arc<Proxy>,
    session: &str,
    model: &str,
    turns: u32,
    stream: bool,
) -> Vec<Value> {
    let (proxy, session, model) = (
        std::sync::Arc::clone(proxy),
        session.to_owned(),
        model.to_owned(),
    );
    tokio::task::spawn_blocking(move || run_agent(&proxy, &session, &model, turns, stream))
        .await
        .unwrap()
}

/// The tool message answering `id` in a request the upstream received.
fn result_of<'a>(request: &'a Value, id: &str) -> &'a Value {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id} in {request}"))
}

/// The ladder as the client library sees it: three released calls (the 3rd warned: the nudge
/// reaches the model with its result), the 4th refused as a well-formed text turn, the 5th an
/// error the library raises.
/// `commands`: the proxy lets this caller use in-chat commands, so its stop message names them.
fn assert_looping_conversation(turns: &[Value], requests: &[Value], stream: bool, commands: bool) {
    assert_eq!(turns.len(), 5, "stopped at the 5th turn: {turns:#?}");
    for (i, t) in turns[..3].iter().enumerate() {
        let n = i + 1;
        assert_eq!(t["finish_reason"], "tool_calls", "{t}");
        assert_eq!(t["content"], "Building.", "{t}");
        assert_eq!(
            t["tool_calls"],
            json!([{"id": format!("call_{n}"), "name": "bash", "arguments": BUILD}]),
            "{t}"
        );
    }
    // The warning: the 3rd call's result carries the nudge in the 4th request to the model.
    assert_eq!(
        result_of(&requests[3], "call_3")["content"],
        "error: could not compile `app`\n\n[loopguard] Loop detected: bash called 3 times with \
         the same arguments. Change your approach."
    );
    assert_eq!(
        result_of(&requests[2], "call_2")["content"],
        "error: could not compile `app`",
        "no nudge before the 3rd call"
    );
    // The refusal: no call for the client to run, a finish reason that says so.
    let refused = &turns[3];
    assert_eq!(refused["tool_calls"], json!([]), "{refused}");
    assert_eq!(refused["finish_reason"], "stop", "{refused}");
    let text = refused["content"].as_str().unwrap();
    assert!(
        text.starts_with("Building.\n\n[loopguard] Refused: bash called 4 times"),
        "{text}"
    );
    // The stop: an error the library raises, naming the tool, the count and what to change.
    let e = &turns[4]["error"];
    if stream {
        assert_eq!(e["class"], "APIError", "a mid-stream error event: {e}");
    } else {
        assert_eq!(e["class"], "BadRequestError", "{e}");
        assert_eq!(e["status"], 400, "{e}");
    }
    assert_eq!(e["code"], "tool_loop_terminated", "{e}");
    assert_eq!(e["type"], "loop_detected", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("`bash`, 5 times"), "{message}");
    assert_eq!(
        message.contains("!/set(tool-loop-max-repeats=N)"),
        commands,
        "{message}"
    );
    assert_eq!(requests.len(), 5, "every turn asked the model once");
    assert!(
        requests
            .iter()
            .all(|r| r["stream"].as_bool().unwrap_or(false) == stream)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_client_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = std::sync::Arc::new(p);
    let turns = agent(&p, "py-loop", "loop", 8, false).await;
    assert_looping_conversation(&turns, &up.requests(), false, false);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_client_streaming_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &["--allow-chat-commands"]);
    let p = std::sync::Arc::new(p);
    let turns = agent(&p, "py-loop-stream", "loop", 8, true).await;
    assert_looping_conversation(&turns, &up.requests(), true, true);
    // Streams really were streamed: the text came in several deltas.
    assert!(turns[0]["chunks"].as_u64().unwrap() >= 4, "{}", turns[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_that_does_not_loop_reaches_the_openai_client_unchanged() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = std::sync::Arc::new(p);
    let mut n = 0;
    for stream in [false, true] {
        // Text only: multi-byte characters, escapes, markdown, whitespace, byte for byte.
        let turns = agent(&p, &format!("py-rich-{stream}"), "rich", 1, stream).await;
        n += 1;
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0]["content"], RICH, "stream: {stream}");
        assert_eq!(turns[0]["finish_reason"], "stop");
        // A working agent: a new file every turn, with text and non-ASCII arguments.
        let session = format!("py-explore-{stream}");
        let turns = agent(&p, &session, "explore", 8, stream).await;
        assert_eq!(turns.len(), 8);
        for t in &turns {
            n += 1;
            let args = format!(r#"{{"path": "src/módulo_{n}.rs", "note": "naïve \"quoted\" ✓"}}"#);
            assert_eq!(
                t["content"], "Reading the next file.",
                "stream: {stream}: {t}"
            );
            assert_eq!(t["finish_reason"], "tool_calls", "{t}");
            assert_eq!(
                t["tool_calls"],
                json!([{"id": format!("read_{n}"), "name": "read_file", "arguments": args}]),
                "stream: {stream}"
            );
        }
    }
    // Nothing was added on the way to the model either: every result is what the agent sent.
    let requests = up.requests();
    assert_eq!(requests.len(), n);
    for r in &requests {
        for m in r["messages"].as_array().unwrap() {
            if m["role"] == "tool" {
                assert_eq!(m["content"], "error: could not compile `app`", "{r}");
            }
            assert!(!m.to_string().contains("[loopguard]"), "{m}");
        }
    }
    let m = support::metrics(&p).await;
    assert!(!m.contains("loopguard_proxy_interventions_total{"), "{m}");
}
