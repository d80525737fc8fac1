#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` speaking Google Gemini `generateContent`, between an agent loop over raw
//! HTTP and a scripted Gemini upstream on 127.0.0.1 (`/v1beta/models/{model}:{method}`, calls
//! without ids as Gemini sends them): a conversation that does not loop reaches the client
//! unchanged; a looping one is warned (the nudge in the function response the model reads next),
//! refused (the call taken out, the refusal as the model's text) and stopped (a Google-shaped
//! error, the same status and code whole and streamed); `chance_then_break` asks the upstream
//! again unseen; the API key, as a header or a query parameter, never comes back; and a
//! malformed request gets a Google-shaped 400. Every mode: a whole response
//! (`generateContent`), a stream of events (`streamGenerateContent?alt=sse`) and the JSON array
//! `streamGenerateContent` answers with without `alt=sse`.

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use support::{BUILD, CHANGED, CHECK, Proxy, RICH, TOLD, client, metric, metrics, write_policy};

const KEY: &str = "AIzaSyD-gemini-test-key-0123456789";
const TOOL_OUTPUT: &str = "error: could not compile `app`";
const NUDGE: &str = "[loopguard] Loop detected: bash called 3 times with the same arguments. \
                     Change your approach.";

// --- the scripted Gemini upstream ---------------------------------------------------------------

/// One request the fake received.
#[derive(Clone, Debug)]
struct Got {
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    raw: Bytes,
    body: Value,
    /// The bytes it answered with.
    answer: String,
}

#[derive(Clone, Default)]
struct Fake {
    got: Arc<Mutex<Vec<Got>>>,
}

struct Upstream {
    base: String,
    fake: Fake,
}

impl Upstream {
    async fn start() -> Upstream {
        let fake = Fake::default();
        let app = Router::new()
            .route("/v1beta/models/{*rest}", post(fake_gemini))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream {
            base: format!("http://{addr}"),
            fake,
        }
    }

    fn got(&self) -> Vec<Got> {
        self.fake.got.lock().unwrap().clone()
    }
}

/// The fake's answer for `model`, as (text, calls): `loop` ("Building." and the same call every
/// turn), `quietloop` (the call alone), `chance` (as `loop` until the last function response
/// carries the second chance's guidance, then [`CHANGED`] and `cargo check`), `explore` (a
/// new file read every turn), `text` ([`RICH`], no call).
fn script(model: &str, body: &Value, n: usize) -> (Option<String>, Vec<(String, Value)>) {
    let bash = |args: &str| ("bash".to_owned(), serde_json::from_str(args).unwrap());
    let told = body["contents"]
        .as_array()
        .and_then(|c| c.last())
        .is_some_and(|c| c.to_string().contains(TOLD));
    match model {
        "loop" => (Some("Building.".into()), vec![bash(BUILD)]),
        "quietloop" => (None, vec![bash(BUILD)]),
        "chance" if told => (Some(CHANGED.into()), vec![bash(CHECK)]),
        "chance" => (Some("Building.".into()), vec![bash(BUILD)]),
        "explore" => (
            Some("Reading the next file.".into()),
            vec![(
                "read_file".to_owned(),
                json!({"path": format!("src/módulo_{n}.rs")}),
            )],
        ),
        _ => (Some(RICH.into()), Vec::new()),
    }
}

/// A `GenerateContentResponse` whose first candidate holds `parts`.
fn chunk(parts: Vec<Value>, finish: bool) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if finish {
        candidate["finishReason"] = json!("STOP");
    }
    let mut c = json!({"candidates": [candidate], "modelVersion": "gemini-2.5-flash",
        "responseId": "resp-1"});
    if finish {
        c["usageMetadata"] =
            json!({"promptTokenCount": 12, "candidatesTokenCount": 6, "totalTokenCount": 18});
    }
    c
}

/// What the real API refuses that a proxy could get wrong: no `contents`, and a model content
/// whose calls are not each answered by a function response in the next content.
fn check(body: &Value) -> Option<String> {
    let contents = body["contents"].as_array()?;
    for (i, c) in contents.iter().enumerate() {
        if c["role"] != "model" {
            continue;
        }
        let names = |c: &Value, key: &str| -> Vec<String> {
            let mut v: Vec<String> = c["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p[key]["name"].as_str().map(str::to_owned))
                .collect();
            v.sort();
            v
        };
        let calls = names(c, "functionCall");
        if calls.is_empty() {
            continue;
        }
        let answered = contents
            .get(i + 1)
            .map(|n| names(n, "functionResponse"))
            .unwrap_or_default();
        if i + 1 < contents.len() && answered != calls {
            return Some(format!(
                "contents[{i}]: function calls {calls:?} answered by {answered:?}"
            ));
        }
    }
    None
}

async fn fake_gemini(State(f): State<Fake>, uri: Uri, headers: HeaderMap, raw: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let path = uri.path().to_owned();
    let query = uri.query().map(str::to_owned);
    let last = path.rsplit('/').next().unwrap().to_owned();
    let (model, method) = last.split_once(':').unwrap();
    let n = f.got.lock().unwrap().len() + 1;
    let (status, content_type, answer) = if model == "leak" {
        let key = headers
            .get("x-goog-api-key")
            .map(|v| v.to_str().unwrap().to_owned())
            .or_else(|| {
                query
                    .as_deref()
                    .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("key=")))
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        let e = json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
            "message": format!("API key not valid: {key}. Please pass a valid API key.")}});
        (StatusCode::BAD_REQUEST, "application/json", e.to_string())
    } else if model == "garbage" {
        (
            StatusCode::OK,
            "application/json",
            "{\"candidates\": 7}".to_owned(),
        )
    } else if let Some(problem) = check(&body) {
        let e = json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": problem}});
        (StatusCode::BAD_REQUEST, "application/json", e.to_string())
    } else {
        let (text, calls) = script(model, &body, n);
        let call_parts: Vec<Value> = calls
            .into_iter()
            .map(|(name, args)| json!({"functionCall": {"name": name, "args": args}}))
            .collect();
        let sse = query.as_deref().is_some_and(|q| q.contains("alt=sse"));
        if method == "generateContent" {
            let mut parts: Vec<Value> = text.iter().map(|t| json!({"text": t})).collect();
            parts.extend(call_parts);
            (
                StatusCode::OK,
                "application/json",
                chunk(parts, true).to_string(),
            )
        } else {
            // Text in three pieces, each call in an event of its own, then the finish.
            let mut chunks = Vec::new();
            if let Some(t) = &text {
                for piece in support::thirds(t) {
                    chunks.push(chunk(vec![json!({"text": piece})], false));
                }
            }
            for c in call_parts {
                chunks.push(chunk(vec![c], false));
            }
            chunks.push(chunk(Vec::new(), true));
            if sse {
                // Streamed with pauses, split across reads: text reaches the client before the
                // answer is judged.
                let events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
                f.got.lock().unwrap().push(Got {
                    path,
                    query,
                    headers,
                    raw,
                    body,
                    answer: events.concat(),
                });
                return support::sse_body(events, std::time::Duration::from_millis(20));
            } else {
                (
                    StatusCode::OK,
                    "application/json",
                    Value::Array(chunks).to_string(),
                )
            }
        }
    };
    f.got.lock().unwrap().push(Got {
        path,
        query,
        headers,
        raw,
        body,
        answer: answer.clone(),
    });
    let mut r = (status, answer).into_response();
    r.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    r
}

// --- the client: an agent loop over raw HTTP ---------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// `generateContent`.
    Plain,
    /// `streamGenerateContent?alt=sse`.
    Sse,
    /// `streamGenerateContent` without `alt=sse`: a JSON array.
    Array,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::Sse, Mode::Array];

/// How the key is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Key {
    Header,
    Query,
}

fn path(model: &str, mode: Mode, key: Key) -> String {
    let (method, mut query) = match mode {
        Mode::Plain => ("generateContent", Vec::new()),
        Mode::Sse => ("streamGenerateContent", vec!["alt=sse".to_owned()]),
        Mode::Array => ("streamGenerateContent", Vec::new()),
    };
    if key == Key::Query {
        query.push(format!("key={KEY}"));
    }
    let q = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    format!("/v1beta/models/{model}:{method}{q}")
}

/// One turn as the client saw it.
#[derive(Debug)]
struct Turn {
    status: u16,
    headers: HeaderMap,
    raw: String,
    /// The chunks of the answer (one for a whole response).
    chunks: Vec<Value>,
    /// The parts of the first candidate, all chunks together.
    parts: Vec<Value>,
    /// The error, when the answer was one (whole, or the last event of a stream).
    error: Option<Value>,
}

impl Turn {
    fn calls(&self) -> Vec<&Value> {
        self.parts
            .iter()
            .filter_map(|p| p.get("functionCall"))
            .collect()
    }

    fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect()
    }

    fn loopguard(&self) -> Value {
        self.chunks
            .iter()
            .rev()
            .find_map(|c| c.get("loopguard").cloned())
            .unwrap_or(Value::Null)
    }

    fn finish(&self) -> Value {
        self.chunks
            .iter()
            .rev()
            .find_map(|c| c["candidates"][0].get("finishReason").cloned())
            .unwrap_or(Value::Null)
    }
}

async fn ask(p: &Proxy, model: &str, mode: Mode, key: Key, body: &Value) -> Turn {
    let mut req = client().post(p.url(&path(model, mode, key))).json(body);
    if key == Key::Header {
        req = req.header("x-goog-api-key", KEY);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let raw = resp.text().await.unwrap();
    let mut chunks = Vec::new();
    let mut error = None;
    if status != 200 {
        error = Some(serde_json::from_str::<Value>(&raw).unwrap_or(Value::Null));
    } else if mode == Mode::Sse {
        for ev in raw.split("\n\n").filter(|e| !e.trim().is_empty()) {
            let data = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect::<String>();
            if data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&data).unwrap();
            if v.get("error").is_some() {
                error = Some(v);
            } else {
                chunks.push(v);
            }
        }
    } else {
        match serde_json::from_str::<Value>(&raw).unwrap() {
            Value::Array(c) => chunks = c,
            v => chunks.push(v),
        }
    }
    let parts = chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    Turn {
        status,
        headers,
        raw,
        chunks,
        parts,
        error,
    }
}

/// Runs an agent for `turns` turns (fewer when the proxy answers with an error): each call
/// answered with [`TOOL_OUTPUT`], by name as Gemini's clients answer calls without ids.
async fn run(p: &Proxy, model: &str, turns: usize, mode: Mode) -> (Vec<Turn>, Vec<Value>) {
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "Build the app."}]})];
    let mut out = Vec::new();
    let mut sent = Vec::new();
    for _ in 0..turns {
        let body = json!({
            "contents": contents,
            "systemInstruction": {"parts": [{"text": "You are a build agent."}]},
            "tools": [{"functionDeclarations": [{"name": "bash", "parameters": {"type": "object"}}]}],
        });
        sent.push(body.clone());
        let t = ask(p, model, mode, Key::Header, &body).await;
        let stop = t.error.is_some();
        if !stop {
            // Text parts merged, as the SDKs keep a streamed answer.
            let mut parts = Vec::new();
            let text = t.text();
            if !text.is_empty() {
                parts.push(json!({"text": text}));
            }
            parts.extend(t.calls().into_iter().map(|c| json!({"functionCall": c})));
            let responses: Vec<Value> = t
                .calls()
                .iter()
                .map(|c| json!({"functionResponse": {"name": c["name"], "response": {"output": TOOL_OUTPUT}}}))
                .collect();
            contents.push(json!({"role": "model", "parts": parts}));
            if responses.is_empty() {
                contents.push(json!({"role": "user", "parts": [{"text": "Go on."}]}));
            } else {
                contents.push(json!({"role": "user", "parts": responses}));
            }
        }
        out.push(t);
        if stop {
            break;
        }
    }
    (out, sent)
}

fn start(up: &Upstream, mode: Option<&str>) -> (Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let decisions = dir.path().join("decisions.jsonl");
    let env: Vec<(&str, &str)> = mode.map(|m| ("LOOPGUARD_MODE", m)).into_iter().collect();
    let p = Proxy::spawn(
        &up.base,
        &[
            "--rules",
            policy.to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ],
        &env,
    )
    .unwrap();
    (p, dir)
}

fn decisions(dir: &tempfile::TempDir) -> Vec<Value> {
    std::fs::read_to_string(dir.path().join("decisions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The function response answering the `k`-th call of contents `i` in a request.
fn response_in(body: &Value, i: usize) -> &Value {
    &body["contents"][i]["parts"][0]["functionResponse"]["response"]
}

// --- tests --------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_conversation_is_untouched() {
    let up = Upstream::start().await;
    let (p, dir) = start(&up, None);
    for mode in MODES {
        for model in ["explore", "text"] {
            let before = up.got().len();
            let (turns, sent) = run(&p, model, 4, mode).await;
            let got = &up.got()[before..];
            assert_eq!(got.len(), 4, "{mode:?} {model}");
            for (i, (t, g)) in turns.iter().zip(got).enumerate() {
                let what = format!("{mode:?} {model} turn {i}");
                assert_eq!(t.status, 200, "{what}: {}", t.raw);
                assert!(t.headers.get("x-loopguard-action").is_none(), "{what}");
                assert_eq!(t.loopguard(), Value::Null, "{what}");
                // The upstream got the client's request as it was sent, on the same path,
                // with the client's key.
                assert_eq!(g.body, sent[i], "{what}");
                assert_eq!(
                    g.raw,
                    serde_json::to_vec(&sent[i]).unwrap(),
                    "{what}: the client's bytes"
                );
                assert_eq!(
                    format!("{}?{}", g.path, g.query.clone().unwrap_or_default())
                        .trim_end_matches('?'),
                    path(model, mode, Key::Header),
                    "{what}"
                );
                assert_eq!(g.headers["x-goog-api-key"], KEY, "{what}");
                assert!(g.headers.get("x-session-id").is_none());
                // What the client got: the upstream's bytes, but where a stream's held calls
                // were sent with the answer's last event.
                let has_calls = model == "explore";
                if mode != Mode::Sse || !has_calls {
                    assert_eq!(t.raw, g.answer, "{what}: byte for byte");
                } else {
                    let upstream: Vec<Value> = g
                        .answer
                        .split("\n\n")
                        .filter_map(|e| e.strip_prefix("data: "))
                        .map(|d| serde_json::from_str(d).unwrap())
                        .collect();
                    let parts: Vec<Value> = upstream
                        .iter()
                        .flat_map(|c| {
                            c["candidates"][0]["content"]["parts"]
                                .as_array()
                                .cloned()
                                .unwrap()
                        })
                        .collect();
                    assert_eq!(t.parts, parts, "{what}");
                    assert_eq!(
                        t.finish(),
                        upstream.last().unwrap()["candidates"][0]["finishReason"]
                    );
                }
            }
            if model == "text" {
                assert_eq!(turns[0].text(), RICH);
            }
        }
    }
    assert!(decisions(&dir).is_empty());
    let m = metrics(&p).await;
    assert_eq!(
        metric(&m, "loopguard_proxy_requests_total{route=\"gemini\"}"),
        Some(24),
        "{m}"
    );
}

/// Warned on the 3rd call (the nudge in its function response in the 4th request), refused on
/// the 4th (no call, the refusal as the model's text), stopped on the 5th.
#[tokio::test(flavor = "multi_thread")]
async fn a_looping_conversation_is_warned_refused_and_stopped() {
    for mode in MODES {
        let up = Upstream::start().await;
        let (p, dir) = start(&up, None);
        let (turns, _) = run(&p, "loop", 6, mode).await;
        let what = format!("{mode:?}");
        assert_eq!(turns.len(), 5, "{what}: {turns:#?}");
        for t in &turns[..3] {
            assert_eq!(t.calls().len(), 1, "{what}: {t:?}");
            assert_eq!(t.calls()[0]["args"]["command"], "cargo build", "{what}");
            assert_eq!(t.text(), "Building.", "{what}");
        }
        assert_eq!(turns[0].loopguard(), Value::Null, "{what}");
        // The warning: on the 3rd answer, and in the 3rd call's result in the 4th request.
        let w = &turns[2].loopguard()["interventions"][0];
        assert_eq!(w["action"], "warn", "{what}: {:?}", turns[2]);
        assert_eq!(w["detector"], "exact_repeat", "{what}");
        assert_eq!(w["tool_call_id"], "gemini_2_bash_0", "{what}");
        if mode != Mode::Sse {
            assert_eq!(turns[2].headers["x-loopguard-action"], "warn", "{what}");
        }
        let got = up.got();
        assert_eq!(
            response_in(&got[3].body, 6)["output"],
            format!("{TOOL_OUTPUT}\n\n{NUDGE}"),
            "{what}"
        );
        assert_eq!(
            response_in(&got[3].body, 4)["output"],
            TOOL_OUTPUT,
            "{what}: only the warned call's result"
        );
        assert_eq!(
            response_in(&got[2].body, 4)["output"],
            TOOL_OUTPUT,
            "{what}"
        );
        // The refusal: no call, the note as text, a stop.
        let r = &turns[3];
        assert!(r.calls().is_empty(), "{what}: {r:?}");
        let text = r.text();
        assert!(
            text.starts_with("Building.[loopguard] Refused: bash called 4 times"),
            "{what}: {text}"
        );
        assert_eq!(r.finish(), "STOP", "{what}");
        assert_eq!(
            r.loopguard()["interventions"][0]["action"],
            "block",
            "{what}"
        );
        if mode != Mode::Sse {
            assert_eq!(r.headers["x-loopguard-action"], "block", "{what}");
        }
        // The stop: a Google-shaped error, whole or (text was streamed) the stream's last event.
        let s = &turns[4];
        let e = &s.error.as_ref().unwrap()["error"];
        assert_eq!(e["status"], "FAILED_PRECONDITION", "{what}: {e}");
        assert_eq!(e["code"], 400, "{what}");
        assert_eq!(e["details"][0]["reason"], "tool_loop_terminated", "{what}");
        assert_eq!(e["loopguard"]["tool"], "bash", "{what}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("loopguard stopped"),
            "{what}"
        );
        if mode == Mode::Sse {
            assert_eq!(s.status, 200, "{what}: the stream had begun");
            assert!(s.text().starts_with("Building."), "{what}");
        } else {
            assert_eq!(s.status, 400, "{what}");
            assert_eq!(s.headers["x-loopguard-action"], "terminate", "{what}");
        }
        let log = decisions(&dir);
        let actions: Vec<&str> = log.iter().map(|r| r["action"].as_str().unwrap()).collect();
        assert_eq!(actions, ["warn", "block", "terminate"], "{what}");
        assert!(log.iter().all(|r| r["model"] == "loop"), "{what}: {log:?}");
        let m = metrics(&p).await;
        assert_eq!(
            metric(
                &m,
                "loopguard_proxy_interventions_total{action=\"warn\",detector=\"exact_repeat\"}"
            ),
            Some(1),
            "{what}: {m}"
        );
    }
}

/// A stop decided before anything was streamed is the same error, status and all, as without
/// streaming.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_is_the_same_error_whole_and_streamed() {
    let mut seen = Vec::new();
    for mode in MODES {
        let up = Upstream::start().await;
        let (p, _dir) = start(&up, None);
        let (turns, _) = run(&p, "quietloop", 6, mode).await;
        assert_eq!(turns.len(), 5, "{mode:?}");
        let s = &turns[4];
        assert_eq!(s.status, 400, "{mode:?}: {}", s.raw);
        assert_eq!(s.headers["x-loopguard-action"], "terminate");
        assert_eq!(s.headers["content-type"], "application/json");
        let e = s.error.clone().unwrap();
        seen.push((
            e["error"]["code"].clone(),
            e["error"]["status"].clone(),
            e["error"]["details"][0]["reason"].clone(),
        ));
        // The refused turn before it: nothing but the note.
        assert_eq!(turns[3].calls().len(), 0);
        assert!(
            turns[3].text().starts_with("[loopguard] Refused"),
            "{:?}",
            turns[3]
        );
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    assert_eq!(seen[0].1, "FAILED_PRECONDITION");
}

/// `chance_then_break`: the third identical call is withheld and the upstream asked once more
/// within the same request; a model that changes course is never seen repeating, one that
/// repeats again is refused.
#[tokio::test(flavor = "multi_thread")]
async fn chance_then_break_asks_the_upstream_again_unseen() {
    for mode in MODES {
        let up = Upstream::start().await;
        let (p, dir) = start(&up, Some("chance_then_break"));
        let (turns, _) = run(&p, "chance", 3, mode).await;
        let args: Vec<Value> = turns
            .iter()
            .map(|t| t.calls()[0]["args"]["command"].clone())
            .collect();
        assert_eq!(
            args,
            ["cargo build", "cargo build", "cargo check"],
            "{mode:?}"
        );
        assert_eq!(turns[2].text(), CHANGED, "{mode:?}: {:?}", turns[2]);
        let got = up.got();
        assert_eq!(got.len(), 4, "{mode:?}: one extra upstream request");
        // The retry: the withheld call, answered with the failure and the guidance, on the
        // same path.
        let retry = got[3].body["contents"].as_array().unwrap();
        let n = retry.len();
        let withheld: Vec<&Value> = retry[n - 2]["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.get("functionCall"))
            .collect();
        assert_eq!(withheld.len(), 1, "{mode:?}");
        assert_eq!(withheld[0]["args"]["command"], "cargo build", "{mode:?}");
        let told = retry[n - 1]["parts"][0]["functionResponse"]["response"]["error"]
            .as_str()
            .unwrap();
        assert!(told.contains(TOLD), "{told}");
        assert_eq!(got[3].path, got[2].path);
        assert_eq!(got[3].query, got[2].query);
        p.wait_metric(
            "loopguard_proxy_second_chances_total{outcome=\"changed\"}",
            1,
        )
        .await;
        let log = decisions(&dir);
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0]["second_chance"], "changed");

        let up = Upstream::start().await;
        let (p, _dir) = start(&up, Some("chance_then_break"));
        let (turns, _) = run(&p, "quietloop", 3, mode).await;
        assert_eq!(turns[2].calls().len(), 0, "{mode:?}: {:?}", turns[2]);
        assert!(turns[2].text().starts_with("[loopguard]"), "{mode:?}");
        assert_eq!(up.got().len(), 4, "{mode:?}: at most one extra request");
        p.wait_metric(
            "loopguard_proxy_second_chances_total{outcome=\"repeated\"}",
            1,
        )
        .await;
    }
}

/// An upstream error quoting the key, sent as the `x-goog-api-key` header or as the `key`
/// query parameter, comes back with the key redacted; the upstream got the key as sent.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_key_never_comes_back() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, None);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    for key in [Key::Header, Key::Query] {
        for mode in MODES {
            let what = format!("{key:?} {mode:?}");
            let before = up.got().len();
            let t = ask(&p, "leak", mode, key, &body).await;
            assert_eq!(t.status, 400, "{what}");
            assert!(!t.raw.contains(KEY), "{what}: {}", t.raw);
            let e = t.error.unwrap();
            assert_eq!(
                e["error"]["message"],
                "API key not valid: [redacted]. Please pass a valid API key.",
                "{what}"
            );
            assert_eq!(e["error"]["status"], "INVALID_ARGUMENT", "{what}");
            let g = &up.got()[before];
            match key {
                Key::Header => assert_eq!(g.headers["x-goog-api-key"], KEY, "{what}"),
                Key::Query => {
                    assert!(g.headers.get("x-goog-api-key").is_none(), "{what}");
                    assert!(
                        g.query.as_deref().unwrap().contains(&format!("key={KEY}")),
                        "{what}"
                    );
                }
            }
        }
    }
    assert!(!p.log().contains(KEY), "the proxy's log");
}

/// A request the proxy cannot read, a method it does not serve and an upstream answer it cannot
/// read each get a Google-shaped error; the proxy goes on serving.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_a_google_shaped_error() {
    let up = Upstream::start().await;
    let (p, _dir) = start(&up, None);
    let send = |path: String, body: &'static str| {
        let url = p.url(&path);
        async move {
            let r = client()
                .post(url)
                .header("x-goog-api-key", KEY)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
    };
    for mode in MODES {
        for body in [
            "{not json",
            "[1, 2]",
            "{\"contents\": 5}",
            "{\"contents\": {}}",
        ] {
            let (status, e) = send(path("loop", mode, Key::Header), body).await;
            assert_eq!(status, 400, "{mode:?} {body}: {e}");
            assert_eq!(e["error"]["code"], 400, "{e}");
            assert_eq!(e["error"]["status"], "INVALID_ARGUMENT", "{e}");
            assert!(e["error"]["message"].is_string(), "{e}");
        }
        // Contents that are not Gemini contents still go to the upstream, which judges them.
        let (status, _) = send(
            path("text", mode, Key::Header),
            "{\"contents\": [7, {\"role\": \"user\", \"parts\": [{\"mystery\": 1}]}]}",
        )
        .await;
        assert_eq!(status, 200, "{mode:?}");
    }
    let (status, e) = send("/v1beta/models/loop:predictLongRunning".to_owned(), "{}").await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["status"], "NOT_FOUND", "{e}");
    let (status, e) = send(
        path("garbage", Mode::Plain, Key::Header),
        "{\"contents\": [{\"role\": \"user\", \"parts\": [{\"text\": \"hi\"}]}]}",
    )
    .await;
    assert_eq!(status, 502, "{e}");
    assert_eq!(e["error"]["status"], "UNAVAILABLE", "{e}");
    assert_eq!(
        e["error"]["details"][0]["reason"], "upstream_malformed",
        "{e}"
    );
    let ok = client().get(p.url("/healthz")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
}

/// Under `--require-key`, a Gemini request without a key is a Google-shaped 401 that never
/// reaches the upstream; the `key` query parameter is a key.
#[tokio::test(flavor = "multi_thread")]
async fn require_key_takes_the_query_parameter_as_a_key() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let p = Proxy::start(
        &up.base,
        &["--rules", policy.to_str().unwrap(), "--require-key"],
    );
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    for mode in MODES {
        let r = client()
            .post(p.url(&path("text", mode, Key::Header)))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{mode:?}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["status"], "UNAUTHENTICATED", "{e}");
        assert_eq!(e["error"]["details"][0]["reason"], "missing_api_key", "{e}");
        let t = ask(&p, "text", mode, Key::Query, &body).await;
        assert_eq!(t.status, 200, "{mode:?}: {}", t.raw);
    }
    assert_eq!(up.got().len(), 3, "only the requests with a key went on");
}

/// The decision log is what `loopctl simulate` decides on the conversation as the model made it
/// (its answers as the upstream wrote them, the refused call included without a result, and
/// what the agent sent after each): the proxy reads Gemini contents with the reader `simulate`
/// uses, pairing calls without ids by name and order alike.
#[tokio::test(flavor = "multi_thread")]
async fn the_decision_log_is_what_simulate_decides() {
    let up = Upstream::start().await;
    let (p, dir) = start(&up, None);
    let (turns, sent) = run(&p, "loop", 8, Mode::Plain).await;
    assert_eq!(turns.len(), 5);
    // The history the agent sent last, with the refused answer as the model wrote it, and the
    // answer that was stopped.
    let mut made = sent[4]["contents"].as_array().unwrap().clone();
    let answer = |g: &Got| -> Value {
        let a: Value = serde_json::from_str(&g.answer).unwrap();
        a["candidates"][0]["content"].clone()
    };
    let got = up.got();
    made[7] = answer(&got[3]);
    made.push(answer(&got[4]));
    let conversation = dir.path().join("conversation.json");
    std::fs::write(&conversation, serde_json::to_string(&made).unwrap()).unwrap();
    let out = loopguard_tests::loopctl_clean()
        .args(["simulate", "--json", "--rules"])
        .arg(dir.path().join("policy.yaml"))
        .arg(&conversation)
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
        [
            "action", "detector", "rule", "count", "turn", "kind", "tool",
        ]
        .map(|k| r[k].clone())
    };
    let logged = decisions(&dir);
    assert_eq!(logged.len(), 3, "{logged:?}");
    assert_eq!(
        logged.iter().map(key).collect::<Vec<_>>(),
        simulated.iter().map(key).collect::<Vec<_>>(),
        "the log: {logged:#?}\nsimulate: {simulated:#?}\nthe conversation: {made:#?}"
    );
}

/// In-chat commands in a person's text part are taken out and answered by the proxy in
/// Gemini's shape, as the client asked (whole, `alt=sse`, array); the model never sees them.
#[tokio::test(flavor = "multi_thread")]
async fn in_chat_commands_are_answered_in_gemini_s_shape() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), 3);
    let p = Proxy::start(
        &up.base,
        &["--rules", policy.to_str().unwrap(), "--allow-chat-commands"],
    );
    for mode in MODES {
        let body = json!({"contents": [{"role": "user",
            "parts": [{"text": "!/set(tool-loop-max-repeats=4)"}]}]});
        let t = ask(&p, "text", mode, Key::Header, &body).await;
        assert_eq!(t.status, 200, "{mode:?}: {}", t.raw);
        assert_eq!(t.chunks.len(), 1, "{mode:?}: {}", t.raw);
        if mode == Mode::Array {
            assert!(t.raw.starts_with('['), "{}", t.raw);
        }
        assert!(
            t.text()
                .starts_with("[loopguard] Done: tool-loop-max-repeats=4."),
            "{mode:?}: {}",
            t.text()
        );
        assert_eq!(t.finish(), "STOP");
        // Beside other text, the command is taken out and the rest goes to the model.
        let before = up.got().len();
        let body = json!({"contents": [{"role": "user",
            "parts": [{"text": "!/set(tool-loop-max-repeats=5) build it"}]}]});
        let t = ask(&p, "text", mode, Key::Header, &body).await;
        assert_eq!(t.status, 200);
        let got = &up.got()[before];
        assert_eq!(got.body["contents"][0]["parts"][0]["text"], "build it");
    }
    assert_eq!(
        up.got().len(),
        3,
        "the commands alone never reached the model"
    );
}
