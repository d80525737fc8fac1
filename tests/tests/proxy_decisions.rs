#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy --decisions FILE`: one JSON line per intervention, and `loopctl simulate` on
//! the same conversation makes the same decisions.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_decision_log_is_what_simulate_decides_on_the_same_conversation() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.jsonl");
    let (p, policy_dir) = start(&up, 3, &["--decisions", log.to_str().unwrap()]);
    let first = json!({"role": "user", "content": "build the project"});
    // What the client sends, and the conversation as the model made it (with the calls the
    // proxy refused, which the client never saw, and no results for them).
    let mut messages = vec![first.clone()];
    let mut made = vec![first];
    let mut stopped = false;
    for i in 0..8 {
        let resp = client()
            .post(p.url("/v1/chat/completions"))
            .header("x-session-id", "audited")
            .header("x-request-id", format!("req-{i}"))
            .json(&json!({"model": "loop", "messages": messages}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        let n = up.requests().len();
        made.push(json!({"role": "assistant", "content": "Building.",
            "tool_calls": [tool_call(&format!("call_{n}"), "bash", BUILD)]}));
        if status == StatusCode::BAD_REQUEST {
            stopped = true;
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        let msg = body["choices"][0]["message"].clone();
        messages.push(msg.clone());
        for c in msg["tool_calls"].as_array().into_iter().flatten() {
            let result = json!({"role": "tool", "tool_call_id": c["id"],
                "content": "error: could not compile `app`"});
            messages.push(result.clone());
            made.push(result);
        }
    }
    assert!(stopped, "the loop was stopped");

    let logged: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<&str> = logged
        .iter()
        .map(|d| d["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["warn", "block", "terminate"], "{logged:?}");
    for d in &logged {
        assert_eq!(d["session"], "anon/hdr:audited");
        assert_eq!(d["model"], "loop");
        assert_eq!(d["kind"], "call");
        assert_eq!(d["tool"], "bash");
        assert!(d["time_ms"].as_u64().unwrap() > 0);
        // The request that brought the call: turn t was answered to request t-1.
        let turn = d["turn"].as_u64().unwrap();
        assert_eq!(d["request_id"], format!("req-{}", turn - 1));
        assert_eq!(d["tool_call_id"], format!("call_{turn}"));
    }

    let transcript = dir.path().join("conversation.json");
    std::fs::write(&transcript, serde_json::to_string(&made).unwrap()).unwrap();
    let out = loopguard_tests::loopctl_clean()
        .args(["simulate", "--json", "--rules"])
        .arg(policy_dir.path().join("policy.yaml"))
        .arg(&transcript)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let simulated: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r.get("action").is_some())
        .collect();
    let key = |r: &Value| {
        (
            r["action"].clone(),
            r["detector"].clone(),
            r["rule"].clone(),
            r["count"].clone(),
            r["turn"].clone(),
            r["kind"].clone(),
            r["tool"].clone(),
        )
    };
    assert_eq!(
        logged.iter().map(key).collect::<Vec<_>>(),
        simulated.iter().map(key).collect::<Vec<_>>(),
        "the log: {logged:#?}\nsimulate: {simulated:#?}"
    );
}

// What broke: a decision log that cannot be opened must stop the proxy at start, not lose
// every record silently.
#[tokio::test(flavor = "multi_thread")]
async fn an_unwritable_decision_log_is_a_start_up_error() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let missing = dir.path().join("no-such-dir").join("decisions.jsonl");
    let err = Proxy::spawn(
        &up.base(),
        &[
            "--rules",
            policy.to_str().unwrap(),
            "--decisions",
            missing.to_str().unwrap(),
        ],
        &[],
    )
    .err()
    .expect("the proxy refused to start");
    assert!(err.contains("cannot open the decision log"), "{err}");
}
