#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `chance_then_break` through `loopctl proxy`: the repeated call is withheld, the upstream
//! hears that it failed and is asked once more within the same client request; a model that
//! changes course is never seen repeating by the client, one that repeats again is refused.
//! Plain and streamed: a stream is held whole until its calls are judged, so the retry happens
//! before anything of the turn is sent.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
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
