#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `chance_then_break` through `loopctl proxy`: the repeated call is withheld, the upstream
//! hears that it failed and is asked once more within the same client request; a model that
//! changes course is never seen repeating by the client, one that repeats again is refused.
//! Plain and streamed: a stream is held whole until its calls are judged, so the retry happens
//! before anything of the turn is sent. In every wire format: chat completions, Anthropic
//! Messages, and OpenAI Responses continuing the stored answer or carrying the whole input.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::agent::{self, Conversation, Format, Trace};
use support::messages::tool_use_id;
use support::responses::{call_id, response_id};
use support::*;

/// The assistant message a streamed turn assembles to, and every call any event of the stream
/// carried (a withheld call must leave no trace).
fn assembled(text: &str) -> (Value, Vec<String>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut traces = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("{event}"));
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        let delta = &v["choices"][0]["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.resize(i + 1, Default::default());
            }
            if let Some(id) = tc["id"].as_str() {
                calls[i].0 = id.to_owned();
            }
            calls[i]
                .1
                .push_str(tc["function"]["name"].as_str().unwrap_or_default());
            let args = tc["function"]["arguments"].as_str().unwrap_or_default();
            calls[i].2.push_str(args);
            traces.push(args.to_owned());
        }
    }
    let mut msg = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        msg["tool_calls"] = calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
    }
    (msg, traces)
}

/// Plays an agent for `turns` turns: every call it gets is run and fails. Returns the calls'
/// arguments the client saw per turn (`None`: the turn had no call: a refusal).
async fn run(p: &Proxy, model: &str, turns: usize, stream: bool) -> Vec<Option<String>> {
    let mut messages = vec![json!({"role": "user", "content": "build the project"})];
    let mut seen = Vec::new();
    let session = format!("{model}-{stream}");
    for _ in 0..turns {
        let resp = client()
            .post(p.url("/v1/chat/completions"))
            .header("x-session-id", &session)
            .json(&json!({"model": model, "messages": messages, "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let msg = if stream {
            let (msg, traces) = assembled(&resp.text().await.unwrap());
            // Every call that reached the client in any event is one it was given whole.
            let given: Vec<String> = msg["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["function"]["arguments"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(traces, given);
            msg
        } else {
            let body: Value = resp.json().await.unwrap();
            body["choices"][0]["message"].clone()
        };
        messages.push(msg.clone());
        let calls = msg["tool_calls"].as_array().cloned().unwrap_or_default();
        seen.push(
            calls
                .first()
                .map(|c| c["function"]["arguments"].as_str().unwrap().to_owned()),
        );
        for c in calls {
            messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                "content": "error: could not compile `app`"}));
        }
    }
    seen
}

fn start_chance(up: &Upstream) -> (Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let decisions = dir.path().join("decisions.jsonl");
    let p = Proxy::spawn(
        &up.base(),
        &[
            "--rules",
            policy.to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ],
        &[("LOOPGUARD_MODE", "chance_then_break")],
    )
    .unwrap();
    (p, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_changes_course_is_never_seen_repeating() {
    for stream in [false, true] {
        a_model_that_changes_course(stream).await;
    }
}

async fn a_model_that_changes_course(stream: bool) {
    let up = Upstream::start().await;
    let (p, dir) = start_chance(&up);
    let seen = run(&p, "chance", 3, stream).await;
    // The third `cargo build` was withheld: the client got the model's second answer.
    assert_eq!(
        seen,
        [
            Some(BUILD.to_owned()),
            Some(BUILD.to_owned()),
            Some(CHECK.to_owned())
        ]
    );
    let requests = up.requests();
    assert_eq!(
        requests.len(),
        4,
        "one extra upstream request, in the third turn"
    );
    assert!(requests.iter().all(|r| r["stream"] == json!(stream)));
    // What the upstream heard: the withheld call, answered with the failure and the guidance.
    let retry = requests[3]["messages"].as_array().unwrap();
    let n = retry.len();
    assert_eq!(
        retry[n - 2]["tool_calls"][0]["function"]["arguments"],
        BUILD
    );
    let told = retry[n - 1]["content"].as_str().unwrap();
    assert!(
        told.contains("This exact call was just made and failed the same way"),
        "{told}"
    );
    assert_eq!(
        retry[n - 1]["tool_call_id"],
        retry[n - 2]["tool_calls"][0]["id"]
    );
    p.wait_metric(
        "loopguard_proxy_second_chances_total{outcome=\"changed\"}",
        1,
    )
    .await;
    // The decision log says that the warning was a second chance, and how it went.
    let log = std::fs::read_to_string(dir.path().join("decisions.jsonl")).unwrap();
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{log}");
    assert_eq!(records[0]["action"], "warn");
    assert_eq!(records[0]["second_chance"], "changed");
    assert_eq!(records[0]["turn"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_repeats_again_is_refused() {
    for stream in [false, true] {
        a_model_that_repeats_again(stream).await;
    }
}

async fn a_model_that_repeats_again(stream: bool) {
    let up = Upstream::start().await;
    let (p, _dir) = start_chance(&up);
    let seen = run(&p, "quietloop", 3, stream).await;
    // The third turn: withheld, asked again, the same call again: refused (no call released).
    assert_eq!(seen, [Some(BUILD.to_owned()), Some(BUILD.to_owned()), None]);
    assert_eq!(
        up.requests().len(),
        4,
        "at most one extra upstream request per turn"
    );
    p.wait_metric(
        "loopguard_proxy_second_chances_total{outcome=\"repeated\"}",
        1,
    )
    .await;
}

// --- Anthropic Messages and OpenAI Responses --------------------------------------------------

/// Every format beside chat completions; Responses both continuing the stored response
/// (`previous_response_id`, no session header) and carrying the whole input (`store: false`).
const FORMATS: [Format; 3] = [
    Format::Messages,
    Format::Responses { chain: true },
    Format::Responses { chain: false },
];

/// The call id of the fake's answer to its `n`-th request.
fn call_of(format: Format, n: u64) -> String {
    match format {
        Format::Messages => tool_use_id(n),
        Format::Responses { .. } => call_id(n),
    }
}

/// Every id the fake gave its answer to request `n` (message, call, item, response), quoted as
/// in JSON: a withheld answer must leave none of them in what the client received.
fn traces_of(format: Format, n: u64) -> Vec<String> {
    let ids = match format {
        Format::Messages => vec![tool_use_id(n), format!("msg_{n}")],
        Format::Responses { .. } => vec![
            call_id(n),
            format!("fc_{n}"),
            format!("msg_{n}"),
            response_id(n),
        ],
    };
    ids.into_iter().map(|id| format!("\"{id}\"")).collect()
}

/// The arguments of every call a turn gave the client.
fn inputs(turns: &[agent::Turn]) -> Vec<Vec<Value>> {
    turns
        .iter()
        .map(|t| t.calls.iter().map(|c| c.input.clone()).collect())
        .collect()
}

fn build() -> Value {
    serde_json::from_str(BUILD).unwrap()
}

fn check() -> Value {
    serde_json::from_str(CHECK).unwrap()
}

/// The turn held none of the withheld answer to request `n`: no id of it in any byte, and
/// (streamed) no call id or argument fragment but those of the calls it gave.
fn assert_withheld(format: Format, t: &agent::Turn, n: u64, what: &str) {
    // Not even the withheld answer's id: a second answer continuing it (stored responses) is
    // shown continuing what the client named.
    for id in traces_of(format, n) {
        assert!(
            !t.raw.contains(&id),
            "{what}: {id} reached the client:\n{}",
            t.raw
        );
    }
    assert!(
        !t.raw.contains("Building."),
        "{what}: the withheld answer's text reached the client:\n{}",
        t.raw
    );
    let given: Vec<String> = t.calls.iter().map(|c| c.id.clone()).collect();
    let released: Vec<Value> = t.calls.iter().map(|c| c.input.clone()).collect();
    let mut fragments = String::new();
    for trace in &t.traces {
        match trace {
            Trace::Id(id) => assert!(given.contains(id), "{what}: {id} in a stream event"),
            Trace::Arguments(a) => {
                let a: Value = serde_json::from_str(a).unwrap();
                assert!(released.contains(&a), "{what}: {a} in a stream event");
            }
            Trace::Fragment(f) => fragments.push_str(f),
        }
    }
    if !fragments.is_empty() {
        let a: Value = serde_json::from_str(&fragments).unwrap();
        assert_eq!(
            released,
            [a],
            "{what}: the argument fragments of the stream"
        );
    }
}

/// What the upstream heard in the extra request: the conversation of the turn's first request,
/// the withheld answer and its failed result with the guidance (Responses continuing a stored
/// response: only the result, continuing the withheld answer).
fn assert_retry(format: Format, first: &Received, retry: &Received, n: u64, what: &str) {
    assert_eq!(
        retry.status, 200,
        "{what}: the upstream accepted the retry: {:?}",
        retry.answer
    );
    assert_eq!(retry.body["stream"], first.body["stream"], "{what}");
    assert_eq!(retry.body["model"], first.body["model"], "{what}");
    let withheld = call_of(format, n);
    let told = |text: &str| {
        assert!(
            text.contains("This exact call was just made and failed the same way"),
            "{what}: {text}"
        );
    };
    match format {
        Format::Messages => {
            let sent = first.body["messages"].as_array().unwrap();
            let m = retry.body["messages"].as_array().unwrap();
            assert_eq!(m.len(), sent.len() + 2, "{what}");
            assert_eq!(&m[..sent.len()], &sent[..], "{what}");
            let answer = &m[sent.len()];
            assert_eq!(answer["role"], "assistant", "{what}");
            let call = answer["content"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["type"] == "tool_use")
                .unwrap();
            assert_eq!(call["id"], withheld, "{what}");
            assert_eq!(call["input"], build(), "{what}");
            let result = &m[sent.len() + 1]["content"][0];
            assert_eq!(result["type"], "tool_result", "{what}");
            assert_eq!(result["tool_use_id"], withheld, "{what}");
            assert_eq!(result["is_error"], true, "{what}");
            told(result["content"].as_str().unwrap());
        }
        Format::Responses { chain: true } => {
            assert_eq!(retry.body["previous_response_id"], response_id(n), "{what}");
            let input = retry.body["input"].as_array().unwrap();
            assert_eq!(input.len(), 1, "{what}: {input:?}");
            assert_eq!(input[0]["type"], "function_call_output", "{what}");
            assert_eq!(input[0]["call_id"], withheld, "{what}");
            told(input[0]["output"].as_str().unwrap());
        }
        Format::Responses { chain: false } => {
            assert_eq!(retry.body["store"], false, "{what}");
            assert_eq!(retry.body.get("previous_response_id"), None, "{what}");
            let sent = first.body["input"].as_array().unwrap();
            let input = retry.body["input"].as_array().unwrap();
            assert_eq!(&input[..sent.len()], &sent[..], "{what}");
            // The answer's items (its text, when it had any, then its call), then the failed
            // result.
            let added = &input[sent.len()..];
            let types: Vec<&str> = added.iter().map(|i| i["type"].as_str().unwrap()).collect();
            let [.., call, result] = added else {
                panic!("{what}: {added:?}")
            };
            assert!(
                types[..types.len() - 2].iter().all(|t| *t == "message"),
                "{what}: {types:?}"
            );
            assert_eq!(call["type"], "function_call", "{what}");
            assert_eq!(call["call_id"], withheld, "{what}");
            assert_eq!(call["arguments"], BUILD, "{what}");
            assert_eq!(result["type"], "function_call_output", "{what}");
            assert_eq!(result["call_id"], withheld, "{what}");
            told(result["output"].as_str().unwrap());
        }
    }
}

/// The decision log's records.
fn decisions(dir: &tempfile::TempDir) -> Vec<Value> {
    std::fs::read_to_string(dir.path().join("decisions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_changes_course_is_never_seen_repeating_in_messages_and_responses() {
    for format in FORMATS {
        for stream in [false, true] {
            changes_course(format, stream).await;
        }
    }
}

async fn changes_course(format: Format, stream: bool) {
    let what = format!("{format:?}, stream: {stream}");
    let up = Upstream::start().await;
    let (p, dir) = start_chance(&up);
    let mut c = Conversation::new(format, "chance", stream, &format!("chance-{stream}"));
    let mut turns = Vec::new();
    for _ in 0..4 {
        let t = c.turn(&p).await;
        assert_eq!(t.status, StatusCode::OK, "{what}: {}", t.raw);
        turns.push(t);
    }
    // The third `cargo build` was withheld: the client got the model's second answer, as if
    // it were the first; the fourth is refused (the same call again).
    assert_eq!(
        inputs(&turns),
        [vec![build()], vec![build()], vec![check()], vec![]],
        "{what}"
    );
    let changed = &turns[2];
    assert_eq!(changed.text, [CHANGED], "{what}");
    assert_eq!(changed.calls[0].id, call_of(format, 4), "{what}");
    assert_withheld(format, changed, 3, &what);
    assert_eq!(
        changed.action, None,
        "{what}: nothing to see: {}",
        changed.raw
    );
    assert_eq!(changed.loopguard, Value::Null, "{what}");
    if format == (Format::Responses { chain: true }) {
        assert_eq!(
            changed.id.as_deref(),
            Some(response_id(4).as_str()),
            "{what}"
        );
    }
    let refused = &turns[3];
    assert!(
        refused
            .text
            .last()
            .unwrap()
            .starts_with("[loopguard] Refused:"),
        "{what}: {:?}",
        refused.text
    );
    // One extra upstream request, in the third turn, answered; the fourth request continues
    // from (or carries) the answer the client got.
    let received = up.received(format.route());
    assert_eq!(received.len(), 5, "{what}: one extra upstream request");
    for r in &received {
        assert_eq!(r.status, 200, "{what}: {:?}", r.answer);
        assert_eq!(r.body["stream"], json!(stream), "{what}");
    }
    assert_retry(format, &received[2], &received[3], 3, &what);
    if format == (Format::Responses { chain: true }) {
        assert_eq!(
            received[4].body["previous_response_id"],
            response_id(4),
            "{what}"
        );
    }
    p.wait_metric(
        "loopguard_proxy_second_chances_total{outcome=\"changed\"}",
        1,
    )
    .await;
    let m = metrics(&p).await;
    for outcome in ["repeated", "failed"] {
        let series = format!("loopguard_proxy_second_chances_total{{outcome=\"{outcome}\"}}");
        assert!(metric(&m, &series).unwrap_or(0) == 0, "{what}: {m}");
    }
    // The warning that gave the chance, and the refusal of the next turn, in one session
    // (in chain mode, found by following the responses the client continued).
    let log = decisions(&dir);
    let summary: Vec<(Value, Value, Value)> = log
        .iter()
        .map(|d| {
            (
                d["action"].clone(),
                d["turn"].clone(),
                d["second_chance"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (json!("warn"), json!(3), json!("changed")),
            (json!("block"), json!(4), Value::Null)
        ],
        "{what}: {log:#?}"
    );
    assert_eq!(log[0]["tool_call_id"], call_of(format, 3), "{what}");
    assert_eq!(log[0]["session"], log[1]["session"], "{what}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_repeats_again_is_refused_then_stopped_in_messages_and_responses() {
    for format in FORMATS {
        for stream in [false, true] {
            repeats_again(format, stream).await;
        }
    }
}

async fn repeats_again(format: Format, stream: bool) {
    let what = format!("{format:?}, stream: {stream}");
    let up = Upstream::start().await;
    let (p, dir) = start_chance(&up);
    let mut c = Conversation::new(format, "quietloop", stream, &format!("again-{stream}"));
    let mut turns = Vec::new();
    for _ in 0..5 {
        let t = c.turn(&p).await;
        let stopped = t.status == StatusCode::BAD_REQUEST;
        turns.push(t);
        if stopped {
            break;
        }
    }
    assert_eq!(turns.len(), 5, "{what}: {turns:#?}");
    for t in &turns[..4] {
        assert_eq!(t.status, StatusCode::OK, "{what}: {}", t.raw);
    }
    // The third turn: withheld, asked again, the same call again: refused; so is the fourth;
    // the fifth stops the run, as the same 400 streamed or not.
    assert_eq!(
        inputs(&turns[..4]),
        [vec![build()], vec![build()], vec![], vec![]],
        "{what}"
    );
    for (i, t) in turns[2..4].iter().enumerate() {
        assert_eq!(t.text.len(), 1, "{what}: {:?}", t.text);
        assert!(
            t.text[0].starts_with("[loopguard] Refused:"),
            "{what}: {:?}",
            t.text
        );
        assert_eq!(
            t.action.as_deref(),
            if stream { None } else { Some("block") },
            "{what}"
        );
        assert_eq!(
            t.loopguard["interventions"][0]["action"],
            "block",
            "{what}, turn {}: {}",
            i + 3,
            t.raw
        );
    }
    // Nothing of the first answer; of the second, the refusal (which names its call in the
    // `loopguard` field) but no call to run.
    assert_withheld(format, &turns[2], 3, &what);
    let stop = &turns[4];
    assert_eq!(stop.status, StatusCode::BAD_REQUEST, "{what}: {}", stop.raw);
    let e = stop.error.as_ref().unwrap();
    assert_eq!(e["code"], "tool_loop_terminated", "{what}: {e}");
    assert_eq!(stop.action.as_deref(), Some("terminate"), "{what}");
    // At most one extra upstream request per turn: in the third.
    let received = up.received(format.route());
    assert_eq!(
        received.len(),
        6,
        "{what}: at most one extra upstream request"
    );
    for r in &received {
        assert_eq!(r.status, 200, "{what}: {:?}", r.answer);
    }
    assert_retry(format, &received[2], &received[3], 3, &what);
    p.wait_metric(
        "loopguard_proxy_second_chances_total{outcome=\"repeated\"}",
        1,
    )
    .await;
    let log = decisions(&dir);
    // In the order they happened: the warning that gave the second chance before the
    // refusal of the second answer.
    let actions: Vec<(&str, u64)> = log
        .iter()
        .map(|d| (d["action"].as_str().unwrap(), d["turn"].as_u64().unwrap()))
        .collect();
    let times: Vec<u64> = log.iter().map(|d| d["time_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{what}: {log:#?}");
    assert_eq!(
        actions,
        [("warn", 3), ("block", 3), ("block", 4), ("terminate", 5)],
        "{what}: {log:#?}"
    );
    let warned = log.iter().find(|d| d["action"] == "warn").unwrap();
    assert_eq!(warned["second_chance"], "repeated", "{what}");
    assert!(
        log.iter().all(|d| d["session"] == warned["session"]),
        "{what}: {log:#?}"
    );
}
