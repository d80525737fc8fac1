#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Replicas of `loopctl proxy` behind a load balancer: three real proxy processes sharing their
//! sessions through a real `redis-server` (`--session-store`), a client sending each request of
//! a looping conversation to the next replica in turn. The client must see the same
//! interventions at the same turns, and the model the same conversation, as with one proxy —
//! also when a replica is killed (SIGKILL) and restarted mid-conversation.

mod support;

#[allow(dead_code)]
#[path = "../../crates/store/tests/support/mod.rs"]
mod redis_support;

use axum::http::StatusCode;
use redis_support::RedisServer;
use serde_json::{Value, json};
use support::*;

/// What the client saw in one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    /// `x-loopguard-action`.
    action: Option<String>,
    /// The calls released to the client.
    calls: Vec<String>,
    /// The assistant's text (a refusal is marked).
    text: Option<String>,
}

/// A looping agent: each turn's request goes to `route(turn)`; the agent runs every call it
/// is given (the build always fails) and stops when the proxy stops it.
async fn converse(
    session: &str,
    model: &str,
    turns: usize,
    mut route: impl FnMut(usize) -> String,
) -> Vec<Seen> {
    let mut messages = vec![json!({"role": "user", "content": "build the project"})];
    let mut seen = Vec::new();
    for turn in 0..turns {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", route(turn)))
            .header("authorization", "Bearer sk-replicas")
            .header("x-session-id", session)
            .json(&json!({"model": model, "messages": messages}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let action = resp
            .headers()
            .get("x-loopguard-action")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = resp.json().await.unwrap();
        if status == StatusCode::BAD_REQUEST.as_u16() {
            assert_eq!(body["error"]["code"], "tool_loop_terminated", "{body}");
            seen.push(Seen {
                status,
                action,
                calls: Vec::new(),
                text: None,
            });
            break;
        }
        assert_eq!(status, 200, "{body}");
        let msg = body["choices"][0]["message"].clone();
        let calls: Vec<Value> = msg["tool_calls"].as_array().cloned().unwrap_or_default();
        seen.push(Seen {
            status,
            action,
            calls: calls
                .iter()
                .map(|c| c["function"]["name"].as_str().unwrap().to_owned())
                .collect(),
            text: msg["content"].as_str().map(str::to_owned),
        });
        messages.push(msg);
        for c in &calls {
            messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                "content": "error: could not compile `app`"}));
        }
    }
    seen
}

fn replica(up: &Upstream, policy: &str, redis: &RedisServer) -> Proxy {
    Proxy::start(
        &up.base(),
        &[
            "--rules",
            policy,
            "--session-store",
            &redis.url(),
            "--session-namespace",
            "replicas-test",
        ],
    )
}

/// The conversation with one proxy (no shared store), and what reached the model.
async fn with_one_proxy(policy: &str, session: &str, model: &str) -> (Vec<Seen>, Vec<Value>) {
    let up = Upstream::start().await;
    let p = Proxy::start(&up.base(), &["--rules", policy]);
    let seen = converse(session, model, 8, |_| p.url("")).await;
    (seen, up.requests())
}

async fn metric_of(p: &Proxy, series: &str) -> u64 {
    let text = reqwest::get(p.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metric(&text, series).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_in_turn_see_what_one_proxy_sees() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let policy = policy.to_str().unwrap();
    let redis = RedisServer::start();
    for model in ["loop", "pair"] {
        let session = format!("replicated-{model}");
        let (alone, alone_requests) = with_one_proxy(policy, &session, model).await;
        assert!(
            alone.iter().any(|s| s.action.as_deref() == Some("block")),
            "the conversation is refused at some turn: {alone:?}"
        );
        let up = Upstream::start().await;
        let replicas: Vec<Proxy> = (0..3).map(|_| replica(&up, policy, &redis)).collect();
        let urls: Vec<String> = replicas.iter().map(|p| p.url("")).collect();
        let seen = converse(&session, model, 8, |turn| urls[turn % 3].clone()).await;
        assert_eq!(seen, alone, "model {model}");
        // The model saw the same conversation, nudges included, turn by turn.
        assert_eq!(up.requests(), alone_requests, "model {model}");
        // Each replica read the state another one left.
        for p in &replicas {
            assert!(
                metric_of(p, "loopguard_proxy_session_store_total{op=\"load\"}").await >= 1,
                "{}",
                p.log()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_and_restarted_mid_conversation_forgets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let policy = policy.to_str().unwrap();
    let redis = RedisServer::start();
    let (alone, alone_requests) = with_one_proxy(policy, "restarted", "loop").await;
    let up = Upstream::start().await;
    let mut replicas: Vec<Option<Proxy>> =
        (0..3).map(|_| Some(replica(&up, policy, &redis))).collect();
    let mut urls: Vec<String> = replicas
        .iter()
        .map(|p| p.as_ref().unwrap().url(""))
        .collect();
    // The conversation warns at its 3rd turn; before the 4th (served by replica 0), replica 0
    // is killed without a chance to save anything and started again.
    let mut seen = Vec::new();
    for (turn, s) in converse("restarted", "loop", 8, |turn| {
        if turn == 3 {
            let mut p = replicas[0].take().unwrap();
            p.child.kill().unwrap();
            p.child.wait().unwrap();
            let again = replica(&up, policy, &redis);
            urls[0] = again.url("");
            replicas[0] = Some(again);
        }
        urls[turn % 3].clone()
    })
    .await
    .into_iter()
    .enumerate()
    {
        seen.push(s);
        assert!(turn < 8);
    }
    assert_eq!(seen, alone);
    assert_eq!(up.requests(), alone_requests);
    assert!(
        seen.iter().any(|s| s.action.as_deref() == Some("block")),
        "the restarted replica refused the repeated call: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_of_other_deployments_do_not_share_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let policy = policy.to_str().unwrap();
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = replica(&up, policy, &redis);
    let b = Proxy::start(
        &up.base(),
        &[
            "--rules",
            policy,
            "--session-store",
            &redis.url(),
            "--session-namespace",
            "another-deployment",
        ],
    );
    let (a_url, b_url) = (a.url(""), b.url(""));
    let seen = converse("separate", "loop", 6, |turn| {
        if turn % 2 == 0 {
            a_url.clone()
        } else {
            b_url.clone()
        }
    })
    .await;
    // Each proxy sees every other call only: the loop is flagged later than with one proxy.
    assert!(seen.iter().take(4).all(|s| s.action.is_none()), "{seen:?}");
}

// A state someone else wrote into the store (garbage JSON, an oversized value) is counted as a
// store error and the request is served with what the replica holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_shared_state_is_counted_and_the_request_served() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let policy = policy.to_str().unwrap();
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let p = replica(&up, policy, &redis);
    let url = p.url("");
    let first = converse("corrupt", "explore", 1, |_| url.clone()).await;
    assert_eq!(first[0].status, 200);
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("loopguard:proxy:replicas-test:session:*hdr:corrupt")
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    for garbage in ["{not json".to_owned(), "x".repeat(5 << 20)] {
        let _: () = redis::cmd("HSET")
            .arg(&keys[0])
            .arg("v")
            .arg(format!("forged-{}", garbage.len()))
            .arg("s")
            .arg(garbage)
            .query(&mut conn)
            .unwrap();
        let seen = converse("corrupt", "explore", 1, |_| url.clone()).await;
        assert_eq!(seen[0].status, 200, "{}", p.log());
    }
    assert!(metric_of(&p, "loopguard_proxy_session_store_total{op=\"error\"}").await >= 2);
}
