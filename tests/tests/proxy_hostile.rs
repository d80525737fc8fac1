#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` facing hostile clients and hostile configuration: the real binary between a
//! scripted upstream on 127.0.0.1 and raw or ordinary HTTP clients.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `request` as written (no client normalizes its path) and returns the status line and
/// the rest of the response.
async fn raw(p: &Proxy, request: &str) -> (String, String) {
    let addr = p.base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (status, rest) = text.split_once("\r\n").unwrap_or((&text, ""));
    (status.to_owned(), rest.to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn model_paths_cannot_escape_the_upstream_base_path() {
    let up = Upstream::start().await;
    let p = Proxy::start(&up.base(), &[]);
    for path in [
        "/v1/models/../../x",
        "/v1/models/%2e%2e/%2e%2e/x",
        "/v1/models/%2E%2E%2F%2E%2E%2Fx",
        "/models/..%2f..%2fadmin",
        "/v1/models/./../secret?token=1",
    ] {
        let (status, body) = raw(
            &p,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(
            status.contains(" 400 ") || status.contains(" 404 "),
            "{path}: {status}\n{body}"
        );
    }
    assert_eq!(
        up.fake.other_paths.lock().unwrap().clone(),
        Vec::<String>::new(),
        "requests left the upstream's /v1/models"
    );
    // A model id with a slash (as some providers name models) still reaches the upstream.
    let r = client()
        .get(p.url("/v1/models/meta-llama/Llama-3-8B"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_credentials_are_never_shown_or_logged() {
    let up = Upstream::start().await;
    let with_secrets = |port: u16| {
        format!(
            "http://svc-user:hunter2pw@127.0.0.1:{port}/v1?api-key=SECRETKEY123&api-version=2024-06-01"
        )
    };
    let secrets = ["svc-user", "hunter2pw", "SECRETKEY123"];
    let p = Proxy::start(&with_secrets(up.addr.port()), &[]);
    let health = client().get(p.url("/healthz")).send().await.unwrap();
    let health = health.text().await.unwrap();
    // The query stays after the path: the request reaches the upstream's chat route.
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .json(&json!({"model": "text", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    assert_eq!(up.requests().len(), 1);
    assert!(up.fake.other_paths.lock().unwrap().is_empty());

    // An unreachable upstream: the 502 names it, without its credentials.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let down = Proxy::start(&with_secrets(port), &[]);
    let r = client()
        .post(down.url("/v1/chat/completions"))
        .json(&json!({"model": "text", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 502);
    let failure: Value = r.json().await.unwrap();
    let message = failure["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains(&port.to_string()), "{message}");
    let logs = format!("{}\n{}", p.log(), down.log());
    for s in secrets {
        assert!(!health.contains(s), "{s} in /healthz: {health}");
        assert!(!message.contains(s), "{s} in the 502: {message}");
        assert!(!logs.contains(s), "{s} in the logs:\n{logs}");
    }
}

#[test]
fn an_absurd_timeout_is_refused_at_startup() {
    for value in ["18446744073709551615", "100000000"] {
        let err = match Proxy::spawn("http://127.0.0.1:9/v1", &["--timeout", value], &[]) {
            Ok(_) => panic!("--timeout {value} was accepted"),
            Err(e) => e,
        };
        assert!(err.contains("timeout must be between"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_value_cannot_forge_log_lines_and_arguments_stay_out_of_logs() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, 2, &[]);
    let evil = "mallory\nFORGED INFO loop intervention action=\"allow\"";
    let mut messages = vec![json!({"role": "user", "content": "build it"})];
    let mut intervened = false;
    for _ in 0..6 {
        let r = client()
            .post(p.url("/v1/chat/completions"))
            .json(&json!({"model": "loop", "user": evil, "messages": messages}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        if status != 200 {
            intervened = true;
            break;
        }
        let msg = body["choices"][0]["message"].clone();
        messages.push(msg.clone());
        match msg["tool_calls"].as_array() {
            Some(calls) => {
                for c in calls {
                    messages.push(json!({"role": "tool", "tool_call_id": c["id"],
                        "content": "error: could not compile `app`"}));
                }
            }
            None => intervened = true,
        }
    }
    assert!(intervened, "the loop was never acted on");
    let log = p.log();
    assert!(log.contains("loop intervention"), "{log}");
    for line in log.lines() {
        assert!(!line.starts_with("FORGED"), "a forged log line:\n{log}");
    }
    // The looping call's arguments (`cargo build`) are not in logs above debug.
    assert!(!log.contains("cargo build"), "{log}");
}
