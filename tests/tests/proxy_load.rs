#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl proxy` under load: 200 agent sessions, at most 64 in flight, run through the real
//! binary against a scripted upstream on 127.0.0.1, each for up to 12 turns, plain and streamed.
//!
//! Every session follows its own script, chosen by its index: some loop on a shell call after a
//! few distinct reads, others never loop; their limits differ (the policy's, or one set in chat);
//! they talk plain JSON, SSE, or both in turn. Sessions share the same tool calls, the same call
//! ids (`call_1`, `call_2`, … per session, as many models number them) and the same file paths,
//! so state kept under any key but the session would leak between them. Each session must see
//! the warning, the refusal and the stop at exactly the turn its own history predicts, and the
//! sessions that never reach their limit must never be intervened on. The proxy's /metrics
//! totals must equal the sums over sessions.
//!
//! The upstream answers from the request alone (the session's index in its first message, the
//! turn from the number of assistant messages), and writes what it received back into its
//! answer: the nudges attached to tool results and any message that does not belong to the
//! session. The client compares each turn with the prediction exactly, so a lost count, a
//! nudge on the wrong session, a response delivered to the wrong client or a setting applied
//! to the wrong session all show as a mismatch naming the session and the turn.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use support::Proxy;

/// Sessions run, and how many of them are in flight at once.
const SESSIONS: usize = 200;
const IN_FLIGHT: usize = 64;
/// Turns of a session that never loops (a looping one is stopped before).
const TURNS: u32 = 12;
/// The whole run, sessions and checks, must end within this.
const LIMIT: Duration = Duration::from_secs(120);
const MODEL: &str = "agent";
const BUILD: &str = r#"{"command":"cargo build"}"#;

// --- the sessions' scripts -------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Plain,
    Stream,
    /// Streamed on odd turns, plain on even ones.
    Alternate,
}

/// What one session does, from its index alone.
#[derive(Debug, Clone, Copy)]
struct Plan {
    index: usize,
    /// The identical call that is warned: 3 from the policy, 4 or 5 set in chat.
    threshold: u32,
    /// Distinct reads before the session starts repeating `bash cargo build`; `None`: it
    /// never loops (it runs the build `threshold - 1` times among reads, then answers).
    loops_after: Option<u32>,
    transport: Transport,
}

/// What the model does on one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `read_file src/{n}.rs`: the same paths in every session.
    Read(u32),
    /// `bash cargo build`: the same call in every session.
    Build,
    /// A plain answer, no call.
    Finish,
}

fn plan(index: usize) -> Plan {
    // 3, 4, 5, 7 are coprime, so threshold, looping, distinct reads and transport vary
    // independently across the sessions.
    Plan {
        index,
        threshold: 3 + (index % 3) as u32,
        loops_after: (index % 4 != 3).then_some((index % 5) as u32),
        transport: match index % 7 {
            0..=2 => Transport::Plain,
            3 | 4 => Transport::Stream,
            _ => Transport::Alternate,
        },
    }
}

impl Plan {
    fn step(&self, turn: u32) -> Step {
        match self.loops_after {
            Some(d) if turn <= d => Step::Read(turn),
            Some(_) => Step::Build,
            None if turn == TURNS => Step::Finish,
            None if turn.is_multiple_of(2) && turn / 2 < self.threshold => Step::Build,
            None => Step::Read(turn),
        }
    }

    fn streams(&self, turn: u32) -> bool {
        match self.transport {
            Transport::Plain => false,
            Transport::Stream => true,
            Transport::Alternate => turn % 2 == 1,
        }
    }

    /// The turn whose call is warned (the `threshold`-th build), if the session loops.
    fn warned_at(&self) -> Option<u32> {
        self.loops_after.map(|d| d + self.threshold)
    }

    /// Turns the session runs: a looping one is stopped two turns after the warning.
    fn turns(&self) -> u32 {
        self.warned_at().map_or(TURNS, |w| w + 2)
    }

    fn header(&self) -> String {
        format!("load-{}", self.index)
    }

    /// The first message; a limit other than the policy's is set in it, in chat.
    fn opening(&self) -> String {
        let task = format!("session {}: build the app", self.index);
        if self.threshold == 3 {
            task
        } else {
            format!("!/set(tool-loop-max-repeats={}) {task}", self.threshold)
        }
    }
}

fn call_of(step: Step, turn: u32) -> Option<Call> {
    let id = format!("call_{turn}");
    match step {
        Step::Read(n) => Some(Call {
            id,
            name: "read_file".to_owned(),
            arguments: format!(r#"{{"path":"src/{n}.rs"}}"#),
        }),
        Step::Build => Some(Call {
            id,
            name: "bash".to_owned(),
            arguments: BUILD.to_owned(),
        }),
        Step::Finish => None,
    }
}

fn warn_note(count: u32) -> String {
    format!(
        "[loopguard] Loop detected: bash called {count} times with the same arguments. Change your approach."
    )
}

fn block_note(count: u32) -> String {
    format!(
        "[loopguard] Refused: bash called {count} times with the same arguments. The call was not run."
    )
}

/// The tool result the agent sends back: the same for every run of a call in a session.
fn result_text(index: usize, tool: &str) -> String {
    format!("s{index} {tool} failed")
}

// --- the scripted upstream -------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// What the model says on a turn: its text (the session and turn, then everything in the
/// request that the script does not account for as plain history) and its call.
fn answer(request: &Value) -> Result<(String, Option<Call>), String> {
    let messages = request["messages"].as_array().ok_or("no messages")?;
    let first = messages
        .first()
        .and_then(|m| m["content"].as_str())
        .ok_or("no first message")?;
    let index: usize = first
        .strip_prefix("session ")
        .and_then(|r| r.split_once(':'))
        .and_then(|(n, _)| n.parse().ok())
        .ok_or_else(|| format!("not a session's first message: {first:?}"))?;
    let plan = plan(index);
    let mut text = String::new();
    let mut assistant = 0;
    for m in &messages[1..] {
        let content = m["content"].as_str().unwrap_or_default();
        match m["role"].as_str().unwrap_or_default() {
            "assistant" => {
                assistant += 1;
                if !content.starts_with(&format!("s{index} t{assistant}.")) {
                    text.push_str(&format!(" | foreign assistant message {content:?}"));
                }
            }
            "tool" => {
                let (own, nudge) = match content.split_once("\n\n") {
                    Some((own, nudge)) => (own, Some(nudge)),
                    None => (content, None),
                };
                if !own.starts_with(&format!("s{index} ")) {
                    text.push_str(&format!(" | foreign tool result {own:?}"));
                }
                if let Some(n) = nudge {
                    text.push_str(&format!(
                        " | {} {n}",
                        m["tool_call_id"].as_str().unwrap_or("?")
                    ));
                }
            }
            other => text.push_str(&format!(" | {other} message {content:?}")),
        }
    }
    if first.contains("!/") {
        text.push_str(" | the command was forwarded");
    }
    let turn = assistant + 1;
    if turn > TURNS {
        return Err(format!("session {index} asked for turn {turn}"));
    }
    Ok((
        format!("s{index} t{turn}.{text}"),
        call_of(plan.step(turn), turn),
    ))
}

fn completion(text: &str, call: Option<&Call>) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if let Some(c) = call {
        message["tool_calls"] = json!([{"id": c.id, "type": "function",
            "function": {"name": c.name, "arguments": c.arguments}}]);
    }
    let finish = if call.is_some() { "tool_calls" } else { "stop" };
    json!({
        "id": "chatcmpl-load", "object": "chat.completion", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}

/// The same turn as SSE events, each sent as its own body frame: the text in two deltas, the
/// call's arguments in 4-byte fragments.
fn stream_events(text: &str, call: Option<&Call>) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-load", "object": "chat.completion.chunk", "created": 1,
                "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mid = text.find(' ').unwrap_or(0);
    let mut out = vec![
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": &text[..mid]}), Value::Null),
        chunk(json!({"content": &text[mid..]}), Value::Null),
    ];
    if let Some(c) = call {
        out.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": ""}}]}),
            Value::Null,
        ));
        for piece in c.arguments.as_bytes().chunks(4) {
            out.push(chunk(
                json!({"tool_calls": [{"index": 0, "function":
                    {"arguments": std::str::from_utf8(piece).unwrap()}}]}),
                Value::Null,
            ));
        }
    }
    let finish = if call.is_some() { "tool_calls" } else { "stop" };
    out.push(chunk(json!({}), json!(finish)));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// Requests the upstream answered.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>);

async fn model(State(count): State<Counter>, body: Bytes) -> Response {
    count.0.fetch_add(1, Ordering::SeqCst);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (text, call) = match answer(&request) {
        Ok(a) => a,
        Err(why) => {
            let error = json!({"error": {"message": why, "type": "script", "code": null}});
            return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
        }
    };
    let (content_type, body) = if request["stream"] == json!(true) {
        let frames = stream_events(&text, call.as_ref())
            .into_iter()
            .map(|e| Ok::<_, Infallible>(Bytes::from(e)));
        (
            "text/event-stream",
            Body::from_stream(futures_util::stream::iter(frames)),
        )
    } else {
        (
            "application/json",
            Body::from(completion(&text, call.as_ref()).to_string()),
        )
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, content_type.parse().unwrap());
    r
}

async fn start_upstream() -> (SocketAddr, Counter) {
    let count = Counter::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(model))
        .with_state(count.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, count)
}

// --- the agents --------------------------------------------------------------------------------

/// A turn as the client saw it, reduced to what the script predicts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// The calls were released (`finish_reason: tool_calls`).
    Calls { text: String, calls: Vec<Call> },
    /// The turn ended with text alone (`finish_reason: stop`).
    Text(String),
    /// The run was stopped for looping: `error.loopguard` of the envelope or the final event.
    Stopped {
        session: String,
        tool: String,
        detector: String,
        count: u64,
        loop_start: Option<String>,
    },
    /// Anything else: an unexpected status, a malformed stream, a missing `[DONE]`.
    Odd(String),
}

/// What a session must see on `turn`, from its script and the ladder alone.
fn expected(plan: &Plan, turn: u32) -> Seen {
    let i = plan.index;
    let mut text = format!("s{i} t{turn}.");
    let warned = plan.warned_at();
    if let Some(w) = warned.filter(|w| turn > *w) {
        text.push_str(&format!(" | call_{w} {}", warn_note(plan.threshold)));
    }
    match warned {
        Some(w) if turn == w + 1 => {
            return Seen::Text(format!("{text}\n\n{}", block_note(plan.threshold + 1)));
        }
        Some(w) if turn == w + 2 => {
            let count = plan.threshold + 2;
            // The first build, `count - 1` calls back: the engine keeps a loop's first call id
            // for as long as the loop goes on.
            let start = plan.loops_after.unwrap_or(0) + 1;
            return Seen::Stopped {
                // No API key: the caller part of the session id is `anon`.
                session: format!("anon/hdr:{}", plan.header()),
                tool: "bash".to_owned(),
                detector: "exact_repeat".to_owned(),
                count: u64::from(count),
                loop_start: Some(format!("call_{start}")),
            };
        }
        _ => {}
    }
    match call_of(plan.step(turn), turn) {
        Some(call) => Seen::Calls {
            text,
            calls: vec![call],
        },
        None => Seen::Text(text),
    }
}

fn stopped(error: &Value) -> Seen {
    let d = &error["loopguard"];
    if error["type"] != "loop_detected" || error["code"] != "tool_loop_terminated" {
        return Seen::Odd(format!("an error that is not a loop stop: {error}"));
    }
    Seen::Stopped {
        session: d["session"].as_str().unwrap_or_default().to_owned(),
        tool: d["tool"].as_str().unwrap_or_default().to_owned(),
        detector: d["detector"].as_str().unwrap_or_default().to_owned(),
        count: d["count"].as_u64().unwrap_or_default(),
        loop_start: d["loop_start_call_id"].as_str().map(str::to_owned),
    }
}

fn finished(text: String, calls: Vec<Call>, finish: Option<&str>) -> Seen {
    match (calls.is_empty(), finish) {
        (false, Some("tool_calls")) => Seen::Calls { text, calls },
        (true, Some("stop")) => Seen::Text(text),
        _ => Seen::Odd(format!(
            "finish_reason {finish:?} with calls {calls:?} and text {text:?}"
        )),
    }
}

/// Posts one chat-completions request of `session`.
async fn send(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    body: &Value,
) -> Result<reqwest::Response, Seen> {
    http.post(url)
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .map_err(|e| Seen::Odd(format!("request failed: {e}")))
}

async fn plain_turn(http: &reqwest::Client, url: &str, session: &str, body: &Value) -> Seen {
    let resp = match send(http, url, session, body).await {
        Ok(r) => r,
        Err(odd) => return odd,
    };
    let status = resp.status().as_u16();
    let body: Value = match resp.json().await {
        Ok(v) => v,
        Err(e) => return Seen::Odd(format!("status {status}, body not JSON: {e}")),
    };
    match status {
        200 => {}
        400 => return stopped(&body["error"]),
        _ => return Seen::Odd(format!("status {status}: {body}")),
    }
    let choice = &body["choices"][0];
    let message = &choice["message"];
    let calls = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| Call {
            id: c["id"].as_str().unwrap_or_default().to_owned(),
            name: c["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            arguments: c["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        })
        .collect();
    let text = message["content"].as_str().unwrap_or_default().to_owned();
    finished(text, calls, choice["finish_reason"].as_str())
}

/// A streamed turn assembled as an OpenAI client does it.
async fn stream_turn(http: &reqwest::Client, url: &str, session: &str, body: &Value) -> Seen {
    let resp = match send(http, url, session, body).await {
        Ok(r) => r,
        Err(odd) => return odd,
    };
    let status = resp.status().as_u16();
    let raw = match resp.text().await {
        Ok(t) => t,
        Err(e) => return Seen::Odd(format!("status {status}, the stream broke: {e}")),
    };
    if status != 200 {
        return Seen::Odd(format!("status {status}: {raw}"));
    }
    let mut text = String::new();
    let mut calls: BTreeMap<u64, Call> = BTreeMap::new();
    let mut finish = None;
    let mut done = false;
    let mut error = None;
    for event in raw.split("\n\n").filter(|e| !e.trim().is_empty()) {
        if done || error.is_some() {
            return Seen::Odd(format!("an event after the end: {event:?}"));
        }
        let Some(data) = event.strip_prefix("data: ") else {
            return Seen::Odd(format!("not a data event: {event:?}"));
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Seen::Odd(format!("not JSON: {data:?}"));
        };
        if v.get("error").is_some() {
            error = Some(v["error"].clone());
            continue;
        }
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
        }
        for tc in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let c = calls
                .entry(tc["index"].as_u64().unwrap_or(u64::MAX))
                .or_insert_with(|| Call {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
            if let Some(id) = tc["id"].as_str() {
                c.id = id.to_owned();
            }
            if let Some(n) = tc["function"]["name"].as_str() {
                c.name.push_str(n);
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                c.arguments.push_str(a);
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    match (error, done) {
        (Some(e), false) => stopped(&e),
        (None, true) => finished(text, calls.into_values().collect(), finish.as_deref()),
        (e, done) => Seen::Odd(format!("stream ended with error {e:?}, [DONE] {done}")),
    }
}

/// Runs one session as an agent would: sends its history, runs the released calls (each fails
/// the same way every time), and goes on until stopped or out of turns. Compares every turn
/// with the prediction; the first difference ends the session.
async fn run_session(http: &reqwest::Client, url: &str, plan: Plan) -> Result<(), String> {
    let session = plan.header();
    let mut messages = vec![json!({"role": "user", "content": plan.opening()})];
    for turn in 1..=plan.turns() {
        let stream = plan.streams(turn);
        let body = json!({"model": MODEL, "messages": messages, "stream": stream});
        let seen = if stream {
            stream_turn(http, url, &session, &body).await
        } else {
            plain_turn(http, url, &session, &body).await
        };
        let want = expected(&plan, turn);
        if seen != want {
            return Err(format!(
                "session {} ({plan:?}), turn {turn} ({}):\n  expected {want:?}\n  got      {seen:?}",
                plan.index,
                if stream { "streamed" } else { "plain" }
            ));
        }
        match seen {
            Seen::Calls { text, calls } => {
                let wire: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                messages.push(json!({"role": "assistant", "content": text, "tool_calls": wire}));
                for c in &calls {
                    messages.push(json!({"role": "tool", "tool_call_id": c.id,
                        "content": result_text(plan.index, &c.name)}));
                }
            }
            Seen::Text(text) => messages.push(json!({"role": "assistant", "content": text})),
            Seen::Stopped { .. } | Seen::Odd(_) => break,
        }
    }
    Ok(())
}

// --- the metrics ---------------------------------------------------------------------------------

/// Every line of a series family (`name{labels} value`, or `name value`), by series.
fn family(text: &str, name: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The totals /metrics must show: the sums over the sessions' scripts.
fn expected_metrics(plans: &[Plan]) -> BTreeMap<String, u64> {
    let mut requests = 0;
    let mut calls = 0;
    let mut results = 0;
    let mut looping = 0;
    let mut commands = 0;
    for p in plans {
        let turns = u64::from(p.turns());
        requests += turns;
        if p.threshold != 3 {
            commands += 1;
        }
        match p.warned_at() {
            // A call every turn; the results of the calls released before the refusal.
            Some(w) => {
                looping += 1;
                calls += turns;
                results += u64::from(w);
            }
            // A call every turn but the last; each answered in the next request.
            None => {
                calls += turns - 1;
                results += turns - 1;
            }
        }
    }
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: u64| {
        m.insert(k.to_owned(), v);
    };
    put(
        "loopguard_proxy_requests_total{route=\"chat_completions\"}",
        requests,
    );
    put("loopguard_proxy_tool_calls_total", calls);
    put("loopguard_proxy_tool_results_total", results);
    for action in ["block", "terminate", "warn"] {
        put(
            &format!(
                "loopguard_proxy_interventions_total{{action=\"{action}\",detector=\"exact_repeat\"}}"
            ),
            looping,
        );
    }
    put(
        "loopguard_proxy_commands_total{result=\"applied\"}",
        commands,
    );
    put("loopguard_proxy_client_disconnects_total", 0);
    put("loopguard_proxy_sessions", plans.len() as u64);
    put("loopguard_proxy_request_duration_seconds_count", requests);
    m
}

// --- the test ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn many_concurrent_sessions_each_meet_their_own_ladder() {
    let (addr, upstream_requests) = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // The ladder every session climbs: warn at the threshold (3, unless set in chat), refuse
    // one call later, stop at the next. Only `exact_repeat` runs, so every intervention is
    // predictable from the script.
    let policy = support::write_policy(dir.path(), 3);
    let proxy = Proxy::start(
        &format!("http://{addr}/v1"),
        &["--rules", policy.to_str().unwrap(), "--allow-chat-commands"],
    );
    let plans: Vec<Plan> = (0..SESSIONS).map(plan).collect();
    // The script covers what it is meant to: looping and non-looping sessions at every
    // threshold, in every transport.
    for t in [Transport::Plain, Transport::Stream, Transport::Alternate] {
        for threshold in 3..=5 {
            for loops in [true, false] {
                assert!(
                    plans.iter().any(|p| p.transport == t
                        && p.threshold == threshold
                        && p.loops_after.is_some() == loops),
                    "no session with {t:?}, threshold {threshold}, looping {loops}"
                );
            }
        }
    }
    assert!(plans.iter().all(|p| p.turns() <= TURNS));

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = proxy.url("/v1/chat/completions");
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (http, url, next) = (http.clone(), url.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut failures = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= SESSIONS {
                        return failures;
                    }
                    if let Err(e) = run_session(&http, &url, plan(i)).await {
                        failures.push(e);
                    }
                }
            })
        })
        .collect();
    let run = async {
        let mut failures = Vec::new();
        for w in workers {
            failures.extend(w.await.unwrap());
        }
        failures
    };
    let failures = tokio::time::timeout(LIMIT, run)
        .await
        .unwrap_or_else(|_| panic!("the sessions did not finish within {LIMIT:?}"));
    assert!(
        failures.is_empty(),
        "{} of {SESSIONS} sessions diverged from their script; the first ones:\n{}\n\nproxy log (tail):\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n"),
        tail(&proxy.log(), 40)
    );

    // The proxy counted exactly what the sessions did, and the upstream saw every turn once.
    let text = http
        .get(proxy.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let want = expected_metrics(&plans);
    let mut got = BTreeMap::new();
    for name in [
        "loopguard_proxy_requests_total",
        "loopguard_proxy_tool_calls_total",
        "loopguard_proxy_tool_results_total",
        "loopguard_proxy_interventions_total",
        "loopguard_proxy_commands_total",
        "loopguard_proxy_upstream_errors_total",
        "loopguard_proxy_client_disconnects_total",
        "loopguard_proxy_sessions",
        "loopguard_proxy_request_duration_seconds_count",
    ] {
        got.extend(family(&text, name));
    }
    // This scrape is counted as it is served.
    got.remove("loopguard_proxy_requests_total{route=\"metrics\"}");
    assert_eq!(got, want, "/metrics against the sums over sessions");
    assert_eq!(
        upstream_requests.0.load(Ordering::SeqCst),
        want["loopguard_proxy_requests_total{route=\"chat_completions\"}"],
        "requests the upstream answered"
    );
    assert!(!proxy.log().contains("panicked"), "{}", proxy.log());
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
