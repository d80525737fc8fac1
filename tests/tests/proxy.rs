#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy`, run as the real binary between a scripted OpenAI upstream (an axum app on
//! 127.0.0.1) and an HTTP client playing the agent: loops are warned, refused and stopped in
//! non-streaming and streaming responses; in-chat commands; metrics; SIGHUP reloads; upstream
//! failures; other sessions keep being served.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::*;

/// One non-streaming request: status and body.
async fn chat(p: &Proxy, session: &str, model: &str, messages: &[Value]) -> (StatusCode, Value) {
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-test")
        .header("x-session-id", session)
        .json(&json!({"model": model, "messages": messages}))
        .send()
        .await
        .unwrap();
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
    let body = resp.json().await.unwrap();
    (status, body)
}

/// A streamed turn as an OpenAI client assembles it.
#[derive(Debug, Default)]
struct Streamed {
    status: u16,
    text: String,
    /// By index: (id, name, arguments).
    calls: BTreeMap<u64, (String, String, String)>,
    finish: Option<String>,
    error: Option<Value>,
    done: bool,
    events: usize,
}

async fn chat_stream(p: &Proxy, session: &str, model: &str, messages: &[Value]) -> Streamed {
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&json!({"model": model, "messages": messages, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut out = Streamed {
        status: resp.status().as_u16(),
        ..Streamed::default()
    };
    let text = resp.text().await.unwrap();
    if out.status != 200 {
        out.error = serde_json::from_str::<Value>(&text).ok();
        return out;
    }
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("{event}"));
        assert!(!out.done, "nothing may follow [DONE]: {event}");
        assert!(out.error.is_none(), "nothing may follow an error: {event}");
        out.events += 1;
        if data == "[DONE]" {
            out.done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            out.error = Some(v);
            continue;
        }
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            out.text.push_str(t);
        }
        if let Some(tcs) = choice["delta"]["tool_calls"].as_array() {
            for tc in tcs {
                let e = out.calls.entry(tc["index"].as_u64().unwrap()).or_default();
                if let Some(id) = tc["id"].as_str() {
                    e.0 = id.to_owned();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    e.1.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    e.2.push_str(a);
                }
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out.finish = Some(f.to_owned());
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Released,
    Refused,
    Stopped,
}

/// Plays an agent that runs whatever it is given and reports the same failure each time, for
/// at most `turns` turns or until stopped.
async fn agent(
    p: &Proxy,
    session: &str,
    model: &str,
    first: &[Value],
    turns: usize,
) -> (Vec<Outcome>, Vec<Value>) {
    let mut messages = first.to_vec();
    let mut outcomes = Vec::new();
    for _ in 0..turns {
        let (status, body) = chat(p, session, model, &messages).await;
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(body["error"]["type"], "loop_detected", "{body}");
            outcomes.push(Outcome::Stopped);
            messages.push(body);
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        let choice = &body["choices"][0];
        let msg = choice["message"].clone();
        messages.push(msg.clone());
        match msg["tool_calls"].as_array() {
            Some(calls) => {
                assert_eq!(choice["finish_reason"], "tool_calls");
                for c in calls {
                    messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                        "content": "error: could not compile `app`"}));
                }
                outcomes.push(Outcome::Released);
            }
            None => {
                assert_eq!(choice["finish_reason"], "stop", "{body}");
                outcomes.push(Outcome::Refused);
            }
        }
    }
    (outcomes, messages)
}

/// [`agent`], with a framework's own user-role prompt ("Please continue.") appended to each
/// turn's tool results.
async fn agent_prompted(p: &Proxy, session: &str, prompt: &str, turns: usize) -> Vec<Outcome> {
    let mut messages = vec![user("build the project")];
    let mut outcomes = Vec::new();
    for _ in 0..turns {
        let (status, body) = chat(p, session, "loop", &messages).await;
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(body["error"]["type"], "loop_detected", "{body}");
            outcomes.push(Outcome::Stopped);
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        let msg = body["choices"][0]["message"].clone();
        messages.push(msg.clone());
        match msg["tool_calls"].as_array() {
            Some(calls) => {
                for c in calls {
                    messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                        "content": "error: could not compile `app`"}));
                }
                outcomes.push(Outcome::Released);
            }
            None => outcomes.push(Outcome::Refused),
        }
        messages.push(user(prompt));
    }
    outcomes
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Every tool call an assistant message of `request` makes is answered by a tool message.
fn assert_paired(request: &Value) {
    let messages = request["messages"].as_array().unwrap();
    for m in messages {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            let id = &c["id"];
            assert!(
                messages
                    .iter()
                    .any(|r| r["role"] == "tool" && r["tool_call_id"] == *id),
                "call {id} has no result in {request}"
            );
        }
    }
}

// --- tests ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_looping_agent_is_warned_then_refused_then_stopped() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let (outcomes, messages) = agent(&p, "loop-1", "loop", &[user("build the project")], 8).await;
    use Outcome::*;
    assert_eq!(outcomes, [Released, Released, Released, Refused, Stopped]);
    // The 3rd call was warned: its result carries the nudge to the model in the 4th request.
    let requests = up.requests();
    assert_eq!(requests.len(), 5, "every turn asked the model once");
    let fourth = requests[3]["messages"].as_array().unwrap();
    let result3 = fourth
        .iter()
        .find(|m| m["tool_call_id"] == "call_3")
        .unwrap();
    assert_eq!(
        result3["content"],
        "error: could not compile `app`\n\n[loopguard] Loop detected: bash called 3 times \
         with the same arguments. Change your approach."
    );
    // ... and keeps it in later requests, so the history the model sees does not change.
    let fifth = requests[4]["messages"].as_array().unwrap();
    assert!(fifth.contains(result3));
    // The client never saw the 4th call: the turn ended with the refusal as text.
    let refused = &messages[messages.len() - 2];
    assert!(refused.get("tool_calls").is_none());
    let text = refused["content"].as_str().unwrap();
    assert!(
        text.starts_with("Building.\n\n[loopguard] Refused: bash called 4 times"),
        "{text}"
    );
    // The stop names the tool, the count and what to change.
    let error = &messages.last().unwrap()["error"];
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("`bash`, 5 times"), "{message}");
    // In-chat commands are off by default: the stop does not offer them.
    assert!(!message.contains("!/set"), "{message}");
    assert_eq!(error["code"], "tool_loop_terminated");
    assert_eq!(error["loopguard"]["detector"], "exact_repeat");
    assert_eq!(error["loopguard"]["loop_start_call_id"], "call_1");
    assert_eq!(error["loopguard"]["loop_start_call"], 1);
    // Each request the client sent, as forwarded, keeps calls and results paired.
    requests.iter().for_each(assert_paired);
    // Interventions are logged.
    assert!(p.log().contains("loop intervention"), "{}", p.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_assembles_calls_and_enforces_the_same_ladder() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let mut messages = vec![user("build the project")];
    for turn in 1..=5 {
        let s = chat_stream(&p, "stream-1", "loop", &messages).await;
        assert_eq!(s.status, 200, "{s:?}");
        assert!(
            s.text.starts_with("Building."),
            "text passes through: {s:?}"
        );
        match turn {
            1..=3 => {
                assert!(s.done && s.error.is_none(), "{s:?}");
                assert_eq!(s.finish.as_deref(), Some("tool_calls"));
                assert_eq!(s.calls.len(), 1);
                let (id, name, args) = &s.calls[&0];
                assert_eq!(id, &format!("call_{turn}"));
                assert_eq!(name, "bash");
                assert_eq!(args, BUILD, "fragments assembled into the exact arguments");
                messages.push(json!({"role": "assistant", "content": s.text,
                    "tool_calls": [tool_call(id, name, args)]}));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": "error"}));
            }
            4 => {
                assert!(s.done && s.error.is_none(), "{s:?}");
                assert!(
                    s.calls.is_empty(),
                    "the refused call is never released: {s:?}"
                );
                assert_eq!(s.finish.as_deref(), Some("stop"));
                assert!(
                    s.text.contains("[loopguard] Refused: bash called 4 times"),
                    "{s:?}"
                );
                messages.push(json!({"role": "assistant", "content": s.text}));
            }
            _ => {
                assert!(s.calls.is_empty());
                assert!(!s.done, "no [DONE] after the stop");
                let e = &s.error.as_ref().expect("a final error event")["error"];
                assert_eq!(e["type"], "loop_detected");
                assert!(e["message"].as_str().unwrap().contains("`bash`, 5 times"));
            }
        }
    }
    let requests = up.requests();
    assert_eq!(requests.len(), 5);
    assert!(requests.iter().all(|r| r["stream"] == json!(true)));
    let fourth = requests[3]["messages"].as_array().unwrap();
    let nudged = fourth
        .iter()
        .find(|m| m["tool_call_id"] == "call_3")
        .unwrap();
    assert!(
        nudged["content"]
            .as_str()
            .unwrap()
            .contains("[loopguard] Loop detected")
    );
}

/// Frameworks send a user-role prompt on every step; it is not a person and resets nothing,
/// so the loop is stopped exactly when it is without the prompts.
#[tokio::test(flavor = "multi_thread")]
async fn framework_prompts_between_turns_do_not_hide_the_loop() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    use Outcome::*;
    for prompt in [
        "Please continue.",
        "Observation: the command failed.",
        "You did not call a tool. Use a tool or give the final answer.",
    ] {
        let outcomes = agent_prompted(&p, &format!("auto-{prompt}"), prompt, 8).await;
        assert_eq!(
            outcomes,
            [Released, Released, Released, Refused, Stopped],
            "{prompt}"
        );
    }
}

/// A person who says something that changes nothing ("we are going in circles") between the
/// same failing calls does not reset the loop: the run is still stopped. The agent reports
/// each failure in text (a request of its own) and the person answers it.
#[tokio::test(flavor = "multi_thread")]
async fn a_person_repeating_themselves_does_not_reset_the_loop() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let mut messages = vec![user("build the project")];
    let mut stopped_at = None;
    for turn in 1..=24 {
        let (status, body) = chat(&p, "circles", "converse", &messages).await;
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(body["error"]["type"], "loop_detected", "{body}");
            stopped_at = Some(turn);
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        let msg = body["choices"][0]["message"].clone();
        messages.push(msg.clone());
        match msg["tool_calls"].as_array() {
            Some(calls) => {
                for c in calls {
                    messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                        "content": "error: could not compile `app`"}));
                }
            }
            None => messages.push(user("we are going in circles")),
        }
    }
    // Two requests a round (the call, the report); stopped by the 5th identical call's result.
    let stopped_at = stopped_at.expect("the run is stopped");
    assert!(stopped_at <= 12, "{stopped_at}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_call_leaves_every_tool_call_id_paired() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let (outcomes, messages) = agent(&p, "pair-1", "pair", &[user("fix it")], 6).await;
    use Outcome::*;
    // The build repeats between reads of new files: one more repeat before it is a loop.
    assert_eq!(
        outcomes,
        [Released, Released, Released, Released, Released, Stopped]
    );
    // Turn 5: the read went through alone, with its own id; the bash call was taken out.
    let turn5 = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .nth(4)
        .unwrap();
    let calls = turn5["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{turn5}");
    assert_eq!(calls[0]["id"], "read_5");
    // The model learns of the refusal with the read's result, and every call it sees is answered.
    let requests = up.requests();
    let sixth = &requests[5];
    assert_paired(sixth);
    let read5 = sixth["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == "read_5")
        .unwrap();
    assert!(
        read5["content"]
            .as_str()
            .unwrap()
            .contains("[loopguard] Refused: bash called 5 times"),
        "{read5}"
    );
    // The same in a stream: one call released, at index 0.
    let s = chat_stream(&p, "pair-2", "pair", &[user("fix it")]).await;
    assert_eq!(s.calls.len(), 2);
    assert_eq!(s.calls[&1].0, format!("call_{}", requests.len() + 1));
}

/// An agent without native tool calling writes its action in its text (ReAct) and sends the
/// observation back as a user message. The proxy reads that message as the action's result,
/// not as a person's words, and judges the action then: the call already ran, so a warning
/// goes with its observation, a refusal takes the observation's place (in that request and
/// every later one), and a stop ends the run. An agent making progress the same way is never
/// touched. Plain and streamed responses alike.
#[tokio::test(flavor = "multi_thread")]
async fn calls_written_in_text_are_judged_with_their_observations() {
    for stream in [false, true] {
        let up = Upstream::start().await;
        let (p, _dir) = start(&up, 3, &[]);
        let session = format!("react-{stream}");
        let mut messages = vec![user("build the project")];
        let mut statuses = Vec::new();
        for _ in 0..6 {
            let (status, text) = if stream {
                let s = chat_stream(&p, &session, "react", &messages).await;
                (s.status, s.text)
            } else {
                let (status, body) = chat(&p, &session, "react", &messages).await;
                let text = body["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (status.as_u16(), text)
            };
            statuses.push(status);
            if status != 200 {
                break;
            }
            // The client saw the action as the model wrote it.
            assert!(text.ends_with("Action Input: cargo build"), "{text}");
            messages.push(json!({"role": "assistant", "content": text}));
            messages.push(user("Observation: error: could not compile `app`"));
        }
        // Calls 1–5 ran; the 5th is stopped when its observation comes back.
        assert_eq!(statuses, [200, 200, 200, 200, 200, 400], "stream: {stream}");
        let requests = up.requests();
        assert_eq!(requests.len(), 5);
        let last_user = |r: &Value, back: usize| {
            let m = r["messages"].as_array().unwrap();
            m.iter()
                .filter(|m| m["role"] == "user")
                .rev()
                .nth(back)
                .unwrap()["content"]
                .clone()
        };
        // Calls 1 and 2: observations as sent.
        assert_eq!(
            last_user(&requests[2], 0),
            "Observation: error: could not compile `app`"
        );
        // Call 3 was warned: its observation carries the nudge, now and later.
        let warned = "Observation: error: could not compile `app`\n\n[loopguard] Loop detected: \
                      bash called 3 times with the same arguments. Change your approach.";
        assert_eq!(last_user(&requests[3], 0), warned);
        assert_eq!(last_user(&requests[4], 1), warned);
        // Call 4 was refused: its output is kept from the model.
        assert_eq!(
            last_user(&requests[4], 0),
            "[loopguard] Refused: bash called 4 times with the same arguments. The call was not run."
        );

        // Progress in the same form is left alone: every request is forwarded as sent.
        let mut messages = vec![user("read the sources")];
        for i in 0..6 {
            let (status, body) = chat(&p, &format!("walk-{stream}"), "reactwalk", &messages).await;
            assert_eq!(status, 200);
            assert!(body.get("loopguard").is_none(), "{body}");
            let text = body["choices"][0]["message"]["content"].as_str().unwrap();
            messages.push(json!({"role": "assistant", "content": text}));
            messages.push(user(&format!("Observation: fn f{i}() {{}}")));
        }
        let forwarded = up.requests();
        let last = forwarded.last().unwrap();
        assert_eq!(last["messages"].as_array().unwrap().len(), 11);
        assert!(!last.to_string().contains("[loopguard]"), "{last}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn in_chat_commands_set_unset_and_refuse_bad_values() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &["--allow-chat-commands"]);
    use Outcome::*;

    // A valid command is answered by the proxy and never reaches the model.
    let set = user("!/set(tool-loop-max-repeats=5)");
    let (status, body) = chat(&p, "cmd-1", "loop", std::slice::from_ref(&set)).await;
    assert_eq!(status, StatusCode::OK);
    let reply = body["choices"][0]["message"].clone();
    let text = reply["content"].as_str().unwrap();
    assert!(text.contains("tool-loop-max-repeats=5"), "{text}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(up.requests().is_empty(), "a command is not forwarded");
    // The session now refuses the 6th identical call instead of the 4th.
    let first = [set.clone(), reply, user("build it")];
    let (outcomes, _) = agent(&p, "cmd-1", "loop", &first, 6).await;
    assert_eq!(
        outcomes,
        [Released, Released, Released, Released, Released, Refused]
    );
    // The model saw neither the command nor the proxy's reply.
    let forwarded = &up.requests()[0]["messages"];
    assert_eq!(forwarded, &json!([{"role": "user", "content": "build it"}]));

    // Invalid values and unknown names get a clear reply; nothing is forwarded or changed.
    let before = up.requests().len();
    for (command, expect) in [
        (
            "!/set(tool-loop-max-repeats=1)",
            "expected a whole number from 2 to 1000",
        ),
        ("!/set(tool-loop-mode=forever)", "expected one of"),
        (
            "!/set(tool-loop-max-repeat=5)",
            "did you mean `tool-loop-max-repeats`?",
        ),
        ("please !/set(tool-loop-ttl=soon) go on", "tool-loop-ttl"),
    ] {
        let (status, body) = chat(&p, "cmd-2", "loop", &[user(command)]).await;
        assert_eq!(status, StatusCode::OK);
        let text = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.contains(expect), "{command}: {text}");
        assert!(text.contains("Not sent to the model"), "{text}");
    }
    assert_eq!(up.requests().len(), before);
    let (outcomes, _) = agent(&p, "cmd-2", "loop", &[user("build it")], 4).await;
    assert_eq!(
        outcomes,
        [Released, Released, Released, Refused],
        "defaults kept"
    );

    // Unset falls back to the policy; streaming clients get the reply as a stream.
    let s = chat_stream(
        &p,
        "cmd-3",
        "loop",
        &[user("!/set(tool-loop-max-repeats=5)")],
    )
    .await;
    assert!(
        s.done && s.text.contains("tool-loop-max-repeats=5"),
        "{s:?}"
    );
    let s = chat_stream(
        &p,
        "cmd-3",
        "loop",
        &[user("!/unset(tool-loop-max-repeats)")],
    )
    .await;
    assert!(s.text.contains("tool-loop-max-repeats unset"), "{s:?}");
    let (outcomes, _) = agent(&p, "cmd-3", "loop", &[user("build it")], 4).await;
    assert_eq!(outcomes, [Released, Released, Released, Refused]);

    // A command inside a real message is applied and stripped; the rest is forwarded.
    let before = up.requests().len();
    let first = [user(
        "!/set(tool-loop-detection=false) build it, whatever it takes",
    )];
    let (outcomes, _) = agent(&p, "cmd-4", "loop", &first, 6).await;
    assert_eq!(outcomes, [Released; 6], "detection is off for this session");
    let forwarded = &up.requests()[before]["messages"][0]["content"];
    assert_eq!(forwarded, "build it, whatever it takes");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests_calls_and_interventions() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let before = metrics(&p).await;
    assert_eq!(metric(&before, "loopguard_proxy_tool_calls_total"), Some(0));
    assert!(before.contains("# TYPE loopguard_proxy_request_duration_seconds histogram"));
    let _ = agent(&p, "m-1", "loop", &[user("build")], 5).await;
    let after = metrics(&p).await;
    let m = |s: &str| metric(&after, s);
    assert_eq!(
        m("loopguard_proxy_requests_total{route=\"chat_completions\"}"),
        Some(5)
    );
    assert_eq!(m("loopguard_proxy_tool_calls_total"), Some(5));
    assert_eq!(m("loopguard_proxy_tool_results_total"), Some(3));
    for action in ["warn", "block", "terminate"] {
        let series = format!(
            "loopguard_proxy_interventions_total{{action=\"{action}\",detector=\"exact_repeat\"}}"
        );
        assert_eq!(m(&series), Some(1), "{series}\n{after}");
    }
    assert_eq!(m("loopguard_proxy_request_duration_seconds_count"), Some(5));
    assert_eq!(m("loopguard_proxy_sessions"), Some(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_and_a_broken_policy_keeps_the_old_one() {
    let up = Upstream::start().await;
    let (p, dir) = start(&up, 3, &[]);
    use Outcome::*;
    std::fs::write(
        dir.path().join("policy.yaml"),
        "version: 1\ndetectors:\n  exact_repeat: { treshold: 2 }\n",
    )
    .unwrap();
    p.signal("HUP");
    p.wait_metric("loopguard_proxy_policy_reloads_total{result=\"failed\"}", 1)
        .await;
    assert!(
        p.log().contains("previous policy stays in force"),
        "{}",
        p.log()
    );
    assert!(
        p.log().contains("treshold"),
        "the diagnostic is logged: {}",
        p.log()
    );
    let (outcomes, _) = agent(&p, "hup-1", "loop", &[user("build")], 4).await;
    assert_eq!(
        outcomes,
        [Released, Released, Released, Refused],
        "old policy"
    );

    write_policy(dir.path(), 2);
    p.signal("HUP");
    p.wait_metric("loopguard_proxy_policy_reloads_total{result=\"ok\"}", 1)
        .await;
    let (outcomes, _) = agent(&p, "hup-2", "loop", &[user("build")], 3).await;
    assert_eq!(outcomes, [Released, Released, Refused], "new policy");
}

/// A policy replaced by a FIFO nobody writes to: the SIGHUP reload fails at once (reading it
/// would block forever) and the next reload of a real file still works.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reload_of_a_fifo_fails_fast_and_the_next_reload_works() {
    let up = Upstream::start().await;
    let (p, dir) = start(&up, 3, &[]);
    let path = dir.path().join("policy.yaml");
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success();
    assert!(made, "mkfifo");
    p.signal("HUP");
    p.wait_metric("loopguard_proxy_policy_reloads_total{result=\"failed\"}", 1)
        .await;
    assert!(p.log().contains("not a regular file"), "{}", p.log());

    std::fs::remove_file(&path).unwrap();
    write_policy(dir.path(), 2);
    p.signal("HUP");
    p.wait_metric("loopguard_proxy_policy_reloads_total{result=\"ok\"}", 1)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_upstream_is_a_502_and_the_proxy_stays_up() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let p = Proxy::start(&format!("http://127.0.0.1:{port}/v1"), &[]);
    let (status, body) = chat(&p, "down-1", "loop", &[user("hi")]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["type"], "upstream_error");
    assert_eq!(body["error"]["code"], "upstream_unreachable");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&port.to_string())
    );
    let s = chat_stream(&p, "down-2", "loop", &[user("hi")]).await;
    assert_eq!(s.status, 502);
    assert_eq!(s.error.unwrap()["error"]["code"], "upstream_unreachable");
    let health = client().get(p.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let m = metrics(&p).await;
    assert_eq!(
        metric(
            &m,
            "loopguard_proxy_upstream_errors_total{kind=\"unreachable\"}"
        ),
        Some(2)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_stay_in_their_session_and_others_are_served() {
    let up = Upstream::start().await;
    let (mut p, _dir) = start(&up, 3, &["--timeout", "1", "--max-body-bytes", "20000"]);

    // A slow upstream: 504 after the timeout.
    let (status, body) = chat(&p, "f-slow", "slow", &[user("hi")]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "upstream_timeout");
    // Malformed JSON from the upstream: 502.
    let (status, body) = chat(&p, "f-garbage", "garbage", &[user("hi")]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "upstream_malformed");
    // The upstream's own errors pass through as they are.
    let (status, body) = chat(&p, "f-limited", "limited", &[user("hi")]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    // A client that goes away mid-stream.
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .json(&json!({"model": "slowstream", "stream": true, "messages": [user("think")]}))
        .send()
        .await
        .unwrap();
    let mut resp = resp;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    drop(resp);
    p.wait_metric("loopguard_proxy_client_disconnects_total", 1)
        .await;
    // A session stopped for looping.
    let (outcomes, _) = agent(&p, "f-loop", "loop", &[user("build")], 5).await;
    assert_eq!(outcomes.last(), Some(&Outcome::Stopped));
    // Requests the proxy does not serve, and ones too large.
    let r = client()
        .post(p.url("/v1/embeddings"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "unsupported_path");
    let r = client()
        .get(p.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "method_not_allowed"
    );
    let big = "x".repeat(30_000);
    let (status, body) = chat(&p, "f-big", "text", &[user(&big)]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "request_too_large");
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_json"
    );

    // Through all of that, another session is served, its content passed through unchanged.
    let (status, body) = chat(&p, "f-ok", "text", &[user("hi")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        completion(
            "text",
            json!("Hello! The answer is 42, see `ls -la`."),
            Vec::new()
        )
    );
    let s = chat_stream(&p, "f-ok-stream", "text", &[user("hi")]).await;
    assert_eq!(s.text, "Hello! The answer is 42, see `ls -la`.");
    assert!(s.done && s.finish.as_deref() == Some("stop"));
    // /v1/models passes through with the client's key.
    let models: Value = client()
        .get(p.url("/v1/models"))
        .header("authorization", "Bearer sk-test")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "loop");
    assert_eq!(models["seen_auth"], "Bearer sk-test");
    let m = metrics(&p).await;
    for (series, value) in [
        ("loopguard_proxy_upstream_errors_total{kind=\"timeout\"}", 1),
        (
            "loopguard_proxy_upstream_errors_total{kind=\"malformed\"}",
            1,
        ),
        ("loopguard_proxy_upstream_errors_total{kind=\"status\"}", 1),
        ("loopguard_proxy_requests_total{route=\"models\"}", 1),
        // Unreadable requests are counted by why they were refused.
        (
            "loopguard_proxy_requests_refused_total{route=\"chat_completions\",reason=\"request_too_large\"}",
            1,
        ),
        (
            "loopguard_proxy_requests_refused_total{route=\"chat_completions\",reason=\"invalid_json\"}",
            1,
        ),
    ] {
        assert_eq!(metric(&m, series), Some(value), "{series}\n{m}");
    }

    // SIGTERM: a clean shutdown.
    p.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not stop:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}\n{}", p.log());
    assert!(p.log().contains("loopguard proxy stopped"));
}

#[tokio::test(flavor = "multi_thread")]
async fn modes_break_and_chance_then_break_behave_as_named() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &["--allow-chat-commands"]);
    use Outcome::*;
    let agent_in_mode = |session: &'static str, mode: &'static str, turns| {
        let p = &p;
        async move {
            let set = user(&format!("!/set(tool-loop-mode={mode})"));
            let (_, body) = chat(p, session, "loop", std::slice::from_ref(&set)).await;
            let reply = body["choices"][0]["message"].clone();
            agent(p, session, "loop", &[set, reply, user("build")], turns)
                .await
                .0
        }
    };
    // break: the first detection refuses the call.
    let outcomes = agent_in_mode("mode-break", "break", 5).await;
    assert_eq!(outcomes, [Released, Released, Refused, Refused, Stopped]);
    // chance_then_break: the first detection is a second chance the client never sees (the
    // call is withheld and the upstream asked once more, tests/proxy_chance.rs); this model
    // makes the same call again, which is refused, and stopped at the ladder's end.
    let outcomes = agent_in_mode("mode-chance", "chance_then_break", 5).await;
    assert_eq!(outcomes, [Released, Released, Refused, Refused, Stopped]);
    let warned = up
        .requests()
        .iter()
        .flat_map(|r| r["messages"].as_array().unwrap().clone())
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .any(|c| c.contains("A different call will go through"));
    assert!(warned, "the chance_then_break warning reached the model");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_environment_sets_the_server_tier() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let policy = policy.to_str().unwrap();
    use Outcome::*;
    // LOOPGUARD_RULES names the policy, LOOPGUARD_MAX_REPEATS raises its threshold.
    let p = Proxy::spawn(
        &up.base(),
        &[],
        &[("LOOPGUARD_RULES", policy), ("LOOPGUARD_MAX_REPEATS", "4")],
    )
    .unwrap();
    let (outcomes, _) = agent(&p, "env-1", "loop", &[user("build")], 5).await;
    assert_eq!(outcomes, [Released, Released, Released, Released, Refused]);
    // A bad value is refused at start, naming the variable.
    let err = Proxy::spawn(
        &up.base(),
        &["--rules", policy],
        &[("LOOPGUARD_MODE", "brake")],
    )
    .err()
    .expect("a bad LOOPGUARD_MODE stops the start");
    assert!(err.contains("exit status: 1"), "{err}");
    assert!(err.contains("LOOPGUARD_MODE"), "{err}");
    // So is a policy that does not validate.
    std::fs::write(
        dir.path().join("bad.yaml"),
        "version: 1\nwindow: { sise: 3 }\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.yaml");
    let err = Proxy::spawn(&up.base(), &["--rules", bad.to_str().unwrap()], &[])
        .err()
        .expect("an invalid policy stops the start");
    assert!(
        err.contains("exit status: 1") && err.contains("sise"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_sessions_keep_their_own_state() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 3, &[]);
    let p = Arc::new(p);
    use Outcome::*;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let p = Arc::clone(&p);
        tasks.push(tokio::spawn(async move {
            // Half the sessions loop; the others get plain answers in between.
            if i % 2 == 0 {
                agent(&p, &format!("c-{i}"), "loop", &[user("build")], 6)
                    .await
                    .0
            } else {
                let mut outcomes = Vec::new();
                for _ in 0..5 {
                    let (status, _) = chat(&p, &format!("c-{i}"), "text", &[user("hi")]).await;
                    assert_eq!(status, StatusCode::OK);
                    outcomes.push(Released);
                }
                outcomes
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let outcomes = t.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(
                outcomes,
                [Released, Released, Released, Refused, Stopped],
                "session c-{i}"
            );
        } else {
            assert_eq!(outcomes, [Released; 5], "session c-{i}");
        }
    }
    let m = metrics(&p).await;
    let series =
        "loopguard_proxy_interventions_total{action=\"terminate\",detector=\"exact_repeat\"}";
    assert_eq!(metric(&m, series), Some(6), "{m}");
}
