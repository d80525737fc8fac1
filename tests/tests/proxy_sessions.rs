#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Sessions of `loopctl proxy` never wait on each other: one session's events held inside a
//! detector plugin (the `slow` test plugin, which holds one session's events until a file
//! appears) do not delay another session's requests.

mod support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::*;

async fn request(p: &Proxy, session: &str) -> (StatusCode, Value) {
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
        .post(p.url("/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&json!({"model": "loop", "messages": [{"role": "user", "content": "build it"}]}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

// What broke: every session's bookkeeping sat behind one lock held while the engine (and its
// plugins) judged a response, so one slow session stalled every other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_session_held_in_a_plugin_does_not_hold_up_another_session() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    let plugin = loopguard_tests::plugin_path("loopguard-plugin-slow");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nname: slow-plugin\nplugins:\n  - path: {}\n    config: {{ block_session: \"anon/hdr:slow\", dir: {}, max_wait_ms: 100000 }}\n",
            serde_json::to_string(&plugin.display().to_string()).unwrap(),
            serde_json::to_string(&dir.path().display().to_string()).unwrap(),
        ),
    )
    .unwrap();
    let p = Proxy::start(&up.base(), &["--rules", policy.to_str().unwrap()]);

    let held = tokio::spawn({
        let url = p.url("/v1/chat/completions");
        async move {
            let resp = reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap()
                .post(url)
                .header("x-session-id", "slow")
                .json(&json!({"model": "loop", "messages": [{"role": "user", "content": "build it"}]}))
                .send()
                .await
                .unwrap();
            resp.status()
        }
    });
    // The slow session's response is being judged once the plugin has written `entered`.
    let entered = dir.path().join("entered");
    let start = Instant::now();
    while !entered.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the slow session never reached the plugin\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Meanwhile other sessions are served, start to end.
    for i in 0..3 {
        let (status, body) =
            tokio::time::timeout(Duration::from_secs(30), request(&p, &format!("fast-{i}")))
                .await
                .expect("another session waited for the slow one");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "bash"
        );
    }
    assert!(!held.is_finished(), "the slow session is still held");
    std::fs::write(dir.path().join("release"), b"").unwrap();
    assert_eq!(held.await.unwrap(), StatusCode::OK);
}
