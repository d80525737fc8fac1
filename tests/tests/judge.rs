#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! The llm-judge plugin loaded by the real `loopctl simulate` from a policy, against a scripted
//! OpenAI-compatible server on 127.0.0.1: its verdicts show in the timeline where the built-in
//! detectors stay silent.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use loopguard_tests::{loopctl, plugin_path};
use serde_json::{Value, json};

/// Answers every check with `confidence` and remembers the requests.
fn serve(confidence: f64) -> (String, Arc<Mutex<Vec<Value>>>, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    async fn answer(
        State((c, seen)): State<(f64, Arc<Mutex<Vec<Value>>>)>,
        body: String,
    ) -> String {
        seen.lock()
            .unwrap()
            .push(serde_json::from_str(&body).unwrap());
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content":
            json!({"unproductive_state_analysis": "It keeps searching for the same symbol under new names.",
                   "unproductive_state_confidence": c}).to_string()}}],
               "usage": {"prompt_tokens": 900, "completion_tokens": 40}})
        .to_string()
    }
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state((confidence, Arc::clone(&seen)));
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen, rt)
}

/// 34 assistant turns of searches that never repeat exactly: nothing a built-in detector sees.
fn wandering_transcript() -> String {
    let mut lines = vec![
        json!({"type": "user", "text": "Find where the retry delay is configured."}).to_string(),
    ];
    for i in 0..34 {
        let id = format!("c{i}");
        let pattern = format!("retry_?delay_{i}|backoff{i}");
        lines.push(json!({"type": "call", "id": id, "tool": "grep", "arguments": {"pattern": pattern, "path": format!("src/mod{}", i % 7)}}).to_string());
        lines.push(json!({"type": "result", "id": id, "output": format!("src/mod{}/file{i}.rs:{}: // unrelated {i}", i % 7, 10 + i)}).to_string());
    }
    lines.join("\n")
}

fn policy(dir: &std::path::Path, base: &str, log: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("judge.yaml");
    std::fs::write(
        &path,
        format!(
            "version: 1\nname: judge\nplugins:\n  - path: {}\n    config:\n      fast: {{ base_url: \"{base}\", model: fast }}\n      log: \"{}\"\n",
            plugin_path("loopguard-plugin-llm-judge").display(),
            log.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn simulate_shows_the_judges_verdict_where_the_built_in_detectors_stay_silent() {
    let (base, seen, _rt) = serve(0.95);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("judge.log");
    let rules = policy(dir.path(), &base, &log);
    let transcript = dir.path().join("wandering.jsonl");
    std::fs::write(&transcript, wandering_transcript()).unwrap();

    // The default policy alone sees nothing.
    let plain = loopctl()
        .args(["simulate", "--json"])
        .arg(&transcript)
        .output()
        .unwrap();
    assert_eq!(
        plain.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );

    let out = loopctl()
        .args(["simulate", "--json", "--rules"])
        .arg(&rules)
        .arg(&transcript)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let found: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let judge: Vec<&Value> = found
        .iter()
        .filter(|v| v["detector"] == "llm_judge")
        .collect();
    assert!(!judge.is_empty(), "{found:?}");
    // The check starts at turn 30; its verdict applies at the next event (the 30th call's result).
    assert_eq!(judge[0]["call"], 30, "{}", judge[0]);
    assert_eq!(judge[0]["action"], "warn");
    assert!(
        judge[0]["message"]
            .as_str()
            .unwrap()
            .contains("same symbol"),
        "{}",
        judge[0]
    );
    // Checked at turn 30; confidence 0.95 puts the next check round(5 + 10 × 0.05) = 6 turns
    // later, at 36, after the transcript ends.
    let requests = seen.lock().unwrap().len();
    assert_eq!(
        requests, 1,
        "one check in 34 turns after the first at 30 (next due at 36)"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("\"prompt_tokens\":900"), "{logged}");

    // A replay is deterministic.
    let again = loopctl()
        .args(["simulate", "--json", "--rules"])
        .arg(&rules)
        .arg(&transcript)
        .output()
        .unwrap();
    let again: Vec<Value> = String::from_utf8(again.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(again, found);
}

#[test]
fn the_human_timeline_names_the_judge() {
    let (base, _seen, _rt) = serve(0.99);
    let dir = tempfile::tempdir().unwrap();
    let rules = policy(dir.path(), &base, &dir.path().join("log"));
    let transcript = dir.path().join("wandering.jsonl");
    std::fs::write(&transcript, wandering_transcript()).unwrap();
    let out = loopctl()
        .args(["simulate", "-q", "--rules"])
        .arg(&rules)
        .arg(&transcript)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("llm_judge"), "{stdout}");
    assert!(stdout.contains("reviewer model"), "{stdout}");
}
