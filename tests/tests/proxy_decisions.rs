#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy --decisions FILE`: one JSON line per intervention, and `loopctl simulate` on
//! the same conversation makes the same decisions: chat completions, Anthropic Messages and
//! OpenAI Responses (the whole input).

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::agent::{Conversation, Format};
use support::messages::tool_use_id;
use support::responses::call_id;
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

    assert_simulated(&policy_dir, &made, &logged);
}

/// `loopctl simulate --json` on `made` (the conversation as the model made it) with the
/// policy in `policy_dir` stops the run (exit 3) and decides what the proxy logged: the same
/// action, detector, rule, count, turn, kind and tool, in order.
fn assert_simulated(policy_dir: &tempfile::TempDir, made: &[Value], logged: &[Value]) {
    let transcript = policy_dir.path().join("conversation.json");
    std::fs::write(&transcript, serde_json::to_string(made).unwrap()).unwrap();
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
        "the log: {logged:#?}\nsimulate: {simulated:#?}\nthe conversation: {made:#?}"
    );
}

/// An Anthropic Messages conversation, or a Responses one carrying the whole input (`store:
/// false`), through the proxy with `--decisions`: a looping model is warned, refused, then
/// stopped; the log is what `loopctl simulate` decides on the conversation as the model made
/// it (its answers as the upstream wrote them, refused calls included without results, and
/// what the agent sent after each: its calls' results, or "Go on." after a refusal).
async fn decisions_match_simulate(format: Format) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.jsonl");
    let (p, policy_dir) = start(&up, 3, &["--decisions", log.to_str().unwrap()]);
    let mut c = Conversation::new(format, "loop", false, "audited");
    let mut made = vec![c.history[0].clone()];
    let mut stopped = false;
    for i in 0..8 {
        c.request_id = Some(format!("req-{i}"));
        let t = c.turn(&p).await;
        let received = up.received(format.route());
        let answer = received.last().unwrap().answer.clone().unwrap();
        match format {
            Format::Messages => {
                made.push(json!({"role": "assistant", "content": answer["content"]}));
            }
            Format::Responses { .. } => {
                made.extend(answer["output"].as_array().unwrap().iter().cloned());
            }
        }
        if t.status == StatusCode::BAD_REQUEST {
            assert_eq!(
                t.error.as_ref().unwrap()["code"],
                "tool_loop_terminated",
                "{format:?}"
            );
            stopped = true;
            break;
        }
        assert_eq!(t.status, StatusCode::OK, "{format:?}: {}", t.raw);
        made.extend(c.moves().iter().cloned());
    }
    assert!(stopped, "{format:?}: the loop was stopped");
    let logged: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<&str> = logged
        .iter()
        .map(|d| d["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["warn", "block", "terminate"],
        "{format:?}: {logged:?}"
    );
    for d in &logged {
        assert_eq!(d["session"], logged[0]["session"], "{format:?}");
        assert!(
            d["session"].as_str().unwrap().ends_with("/hdr:audited"),
            "{d}"
        );
        assert_eq!(d["model"], "loop");
        let turn = d["turn"].as_u64().unwrap();
        assert_eq!(
            d["request_id"],
            format!("req-{}", turn - 1),
            "{format:?}: {d}"
        );
        let id = match format {
            Format::Messages => tool_use_id(turn),
            Format::Responses { .. } => call_id(turn),
        };
        assert_eq!(d["tool_call_id"], id, "{format:?}: {d}");
    }
    assert_simulated(&policy_dir, &made, &logged);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_decision_log_is_what_simulate_decides_on_an_anthropic_conversation() {
    decisions_match_simulate(Format::Messages).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_decision_log_is_what_simulate_decides_on_a_whole_responses_input() {
    decisions_match_simulate(Format::Responses { chain: false }).await;
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
