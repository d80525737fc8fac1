#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! The judge against a scripted OpenAI-compatible server on 127.0.0.1: every branch of the
//! algorithm, with the real HTTP client and background runtime.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use loopguard_plugin_llm_judge::config::Config;
use loopguard_plugin_llm_judge::plugin::Judge;
use loopguard_plugin_sdk::{Event, EventKind};
use serde_json::{Value, json};

/// What the server answers, in order, per model.
#[derive(Clone, Debug)]
enum Script {
    Answer(f64),
    Status(u16),
    Slow(u64, f64),
    Raw(&'static str),
    RejectStructured,
}

#[derive(Default)]
struct Server {
    scripts: Mutex<Vec<(String, VecDeque<Script>)>>,
    requests: Mutex<Vec<(Value, Option<String>)>>,
}

async fn completions(
    State(s): State<Arc<Server>>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Response {
    let req: Value = serde_json::from_str(&body).unwrap();
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    s.requests.lock().unwrap().push((req.clone(), auth));
    let model = req["model"].as_str().unwrap().to_owned();
    let step = {
        let mut scripts = s.scripts.lock().unwrap();
        scripts
            .iter_mut()
            .find(|(m, _)| *m == model)
            .and_then(|(_, q)| q.pop_front())
            .unwrap_or(Script::Answer(0.1))
    };
    let answer = |c: f64| {
        json!({
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                "content": json!({"unproductive_state_analysis": format!("{model} says {c}"),
                                  "unproductive_state_confidence": c}).to_string()}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20}
        })
        .to_string()
    };
    match step {
        Script::Answer(c) => (StatusCode::OK, answer(c)).into_response(),
        Script::Status(code) => (
            StatusCode::from_u16(code).unwrap(),
            "{\"error\":{\"message\":\"boom\"}}",
        )
            .into_response(),
        Script::Slow(ms, c) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            (StatusCode::OK, answer(c)).into_response()
        }
        Script::Raw(text) => (
            StatusCode::OK,
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
                .to_string(),
        )
            .into_response(),
        Script::RejectStructured => {
            if req.get("response_format").is_some() {
                (
                    StatusCode::BAD_REQUEST,
                    "{\"error\":{\"message\":\"response_format is not supported\"}}",
                )
                    .into_response()
            } else {
                (StatusCode::OK, answer(0.95)).into_response()
            }
        }
    }
}

struct Harness {
    server: Arc<Server>,
    base: String,
    _rt: tokio::runtime::Runtime,
}

fn serve(scripts: Vec<(&str, Vec<Script>)>) -> Harness {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = Arc::new(Server::default());
    *server.scripts.lock().unwrap() = scripts
        .into_iter()
        .map(|(m, s)| (m.to_owned(), s.into()))
        .collect();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(Arc::clone(&server));
    rt.spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Harness {
        server,
        base: format!("http://{addr}/v1"),
        _rt: rt,
    }
}

impl Harness {
    fn judge(&self, extra: Value) -> Judge {
        let mut cfg = json!({
            "fast": {"base_url": self.base, "model": "fast", "api_key_env": "CARGO_PKG_NAME"},
            "strong": {"base_url": self.base, "model": "strong"},
            "timeout_ms": 2000,
            "backoff_ms": 10,
            "log": "off",
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                cfg.as_object_mut().unwrap().remove(k);
            } else {
                cfg[k] = v.clone();
            }
        }
        Judge::new(Config::from_json(cfg).unwrap()).unwrap()
    }

    fn requests(&self) -> Vec<(Value, Option<String>)> {
        self.server.requests.lock().unwrap().clone()
    }

    fn models_asked(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|(r, _)| r["model"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Drives one session: a prompt, then assistant turns of one call and its result each.
struct Agent {
    n: u64,
}

impl Agent {
    fn prompt(&mut self, j: &mut Judge, text: &str) {
        let mut ev = Event::new(EventKind::User, "s");
        ev.text = text;
        assert!(j.on_event(&ev).is_none());
    }

    /// One turn; returns whether any of its events produced a detection.
    fn turn(&mut self, j: &mut Judge, output: &str) -> Option<String> {
        self.n += 1;
        let id = format!("c{}", self.n);
        let mut call = Event::new(EventKind::Call, "s");
        call.call_id = &id;
        call.tool = "bash";
        call.arguments = "{\"command\":\"npm test\"}";
        let a = j.on_event(&call);
        let mut res = Event::new(EventKind::Result, "s");
        res.call_id = &id;
        res.result = output;
        res.is_error = true;
        let b = j.on_event(&res);
        a.or(b).map(|d| d.message)
    }

    fn turns(&mut self, j: &mut Judge, n: u64) -> Vec<(u64, String)> {
        let mut found = Vec::new();
        for _ in 0..n {
            if let Some(m) = self.turn(j, "1 failing") {
                found.push((self.n, m));
            }
            j.wait_idle(Duration::from_secs(10));
        }
        found
    }
}

#[test]
fn no_check_before_turn_30_then_a_confirmed_loop_is_reported_at_the_next_event() {
    // The key comes from the variable the config names; cargo sets CARGO_PKG_NAME for tests.
    assert_eq!(
        std::env::var("CARGO_PKG_NAME").unwrap(),
        env!("CARGO_PKG_NAME")
    );
    let h = serve(vec![
        ("fast", vec![Script::Answer(0.95)]),
        ("strong", vec![Script::Answer(0.9)]),
    ]);
    let mut j = h.judge(json!({}));
    let mut a = Agent { n: 0 };
    a.prompt(&mut j, "make the tests pass");
    assert!(a.turns(&mut j, 29).is_empty());
    assert!(h.requests().is_empty(), "no check before turn 30");
    // Turn 30's call starts the check; its verdict applies at the next event after it arrives:
    // turn 30's result when the check is done by then (a busy machine can pause this thread
    // between the two events), else turn 31.
    let found = a.turns(&mut j, 2);
    assert_eq!(h.models_asked(), ["fast", "strong"]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(matches!(found[0].0, 30 | 31), "{found:?}");
    assert!(
        found[0].1.contains("fast model 0.95, strong model 0.90"),
        "{}",
        found[0].1
    );
    assert!(found[0].1.contains("strong says 0.9"), "{}", found[0].1);

    let (req, auth) = &h.requests()[0];
    assert_eq!(
        auth.as_deref(),
        Some(concat!("Bearer ", env!("CARGO_PKG_NAME")))
    );
    assert_eq!(req["response_format"]["type"], "json_schema");
    let history = req["messages"][1]["content"].as_str().unwrap();
    assert!(
        history.starts_with("ORIGINAL USER REQUEST:\nmake the tests pass"),
        "{history}"
    );
    let lines = history.lines().filter(|l| l.starts_with('[')).count();
    assert!(lines <= 20, "{lines} entries");
    // The window ends on a result, not on the call still waiting for one.
    let last = history.lines().rfind(|l| l.starts_with('[')).unwrap();
    assert!(last.contains("TOOL RESULT"), "{last}");
    assert!(
        req["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("NOT unproductive")
    );
}

fn at_30(h: &Harness, extra: Value) -> (Judge, Agent) {
    let mut j = h.judge(extra);
    let mut a = Agent { n: 0 };
    a.prompt(&mut j, "fix it");
    assert!(a.turns(&mut j, 29).is_empty());
    (j, a)
}

#[test]
fn a_strong_model_below_the_threshold_means_no_loop_and_the_next_check_in_6_turns() {
    let h = serve(vec![
        ("fast", vec![Script::Answer(0.9), Script::Answer(0.2)]),
        ("strong", vec![Script::Answer(0.89)]),
    ]);
    let (mut j, mut a) = at_30(&h, json!({}));
    assert!(a.turns(&mut j, 6).is_empty());
    assert_eq!(h.models_asked(), ["fast", "strong"], "checked at 30 only");
    // 30 + round(5 + 10 × 0.11) = 36.
    assert!(a.turns(&mut j, 1).is_empty());
    assert_eq!(
        h.models_asked(),
        ["fast", "strong", "fast"],
        "checked again at 36"
    );
}

#[test]
fn an_unavailable_strong_model_lets_the_fast_verdict_stand_after_two_attempts() {
    let h = serve(vec![
        ("fast", vec![Script::Answer(0.97)]),
        ("strong", vec![Script::Status(503), Script::Status(503)]),
    ]);
    let (mut j, mut a) = at_30(&h, json!({}));
    let found = a.turns(&mut j, 2);
    assert_eq!(found.len(), 1);
    assert!(found[0].1.contains("fast model 0.97)"), "{}", found[0].1);
    assert_eq!(
        h.models_asked(),
        ["fast", "strong", "strong"],
        "at most 2 attempts"
    );
}

#[test]
fn without_a_strong_model_the_fast_verdict_stands() {
    let h = serve(vec![("fast", vec![Script::Answer(0.92)])]);
    let (mut j, mut a) = at_30(&h, json!({"strong": null}));
    assert_eq!(a.turns(&mut j, 2).len(), 1);
    assert_eq!(h.models_asked(), ["fast"]);
}

#[test]
fn errors_timeouts_and_unusable_answers_fail_open_and_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("judge.log");
    let h = serve(vec![(
        "fast",
        vec![
            Script::Status(500),
            Script::Status(500),
            Script::Slow(1500, 0.99),
            Script::Slow(1500, 0.99),
            Script::Raw("I think the agent is stuck, very confident."),
            Script::Raw("still no json"),
        ],
    )]);
    let (mut j, mut a) = at_30(&h, json!({"timeout_ms": 300, "log": log.to_str().unwrap()}));
    // Checks at 30, 33 and 36 (a failed check keeps the initial cadence): all fail open.
    assert!(a.turns(&mut j, 9).is_empty());
    assert_eq!(h.models_asked().len(), 6, "two attempts per check");
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3, "{text}");
    for r in &records {
        assert!(r["llm_judge"]["outcome"]["failed_open"].is_string(), "{r}");
    }
    assert!(text.contains("HTTP 500"), "{text}");
    assert!(text.contains("timed out"), "{text}");
    assert!(text.contains("unusable answer"), "{text}");
}

#[test]
fn a_server_without_structured_output_is_asked_again_without_it() {
    let h = serve(vec![(
        "fast",
        vec![Script::RejectStructured, Script::RejectStructured],
    )]);
    let (mut j, mut a) = at_30(&h, json!({"strong": null}));
    assert_eq!(a.turns(&mut j, 2).len(), 1);
    let reqs = h.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].0.get("response_format").is_some());
    assert!(reqs[1].0.get("response_format").is_none());
}

#[test]
fn secrets_in_tool_output_never_leave_the_process() {
    let h = serve(vec![("fast", vec![Script::Answer(0.1)])]);
    let mut j = h.judge(json!({"strong": null}));
    let mut a = Agent { n: 0 };
    a.prompt(&mut j, "deploy");
    for _ in 0..30 {
        a.turn(&mut j, "export OPENAI_API_KEY=sk-live-0123456789abcdefghijklmnop\nAuthorization: Bearer abcdefghijklmnopqrstuvwxyz");
        j.wait_idle(Duration::from_secs(10));
    }
    let reqs = h.requests();
    assert_eq!(reqs.len(), 1);
    let body = reqs[0].0.to_string();
    assert!(!body.contains("0123456789abcdefghij"), "{body}");
    assert!(!body.contains("abcdefghijklmnopqrstuvwxyz"), "{body}");
    assert!(body.contains("[REDACTED]"));
}

#[test]
fn blocking_mode_reports_on_the_event_that_started_the_check() {
    let h = serve(vec![("fast", vec![Script::Answer(0.99)])]);
    let mut j = h.judge(json!({"strong": null, "blocking": true}));
    let mut a = Agent { n: 0 };
    a.prompt(&mut j, "go");
    for _ in 0..29 {
        assert!(a.turn(&mut j, "x").is_none());
    }
    let found = a.turn(&mut j, "x");
    assert!(found.is_some(), "turn 30 itself reports");
}

#[test]
fn a_new_prompt_restarts_the_schedule() {
    let h = serve(vec![]);
    let mut j = h.judge(json!({"strong": null}));
    let mut a = Agent { n: 0 };
    a.prompt(&mut j, "one");
    a.turns(&mut j, 25);
    a.prompt(&mut j, "two");
    a.turns(&mut j, 25);
    assert!(h.requests().is_empty());
}
