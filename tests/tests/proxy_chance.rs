#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `chance_then_break` through `loopctl proxy`: the repeated call is withheld, the upstream
//! hears that it failed and is asked once more within the same client request; a model that
//! changes course is never seen repeating by the client, one that repeats again is refused.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::*;

/// Plays an agent for `turns` turns: every call it gets is run and fails. Returns the calls'
/// arguments the client saw per turn (`None`: the turn had no call: a refusal).
async fn run(p: &Proxy, model: &str, turns: usize) -> Vec<Option<String>> {
    let mut messages = vec![json!({"role": "user", "content": "build the project"})];
    let mut seen = Vec::new();
    for _ in 0..turns {
        let resp = client()
            .post(p.url("/v1/chat/completions"))
            .header("x-session-id", model)
            .json(&json!({"model": model, "messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        let msg = body["choices"][0]["message"].clone();
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
    let p = Proxy::spawn(
        &up.base(),
        &["--rules", policy.to_str().unwrap()],
        &[("LOOPGUARD_MODE", "chance_then_break")],
    )
    .unwrap();
    (p, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_changes_course_is_never_seen_repeating() {
    let up = Upstream::start().await;
    let (p, _dir) = start_chance(&up);
    let seen = run(&p, "chance", 3).await;
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
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_repeats_again_is_refused() {
    let up = Upstream::start().await;
    let (p, _dir) = start_chance(&up);
    let seen = run(&p, "quietloop", 3).await;
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
