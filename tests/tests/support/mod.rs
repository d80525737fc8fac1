//! What the proxy tests share: a scripted upstream (an axum app on 127.0.0.1) speaking OpenAI
//! chat completions, Anthropic Messages ([`messages`]) and OpenAI Responses ([`responses`]), the
//! real `loopctl proxy` binary as a child process, the test policy, the runner of the Python
//! agents on the official clients, and an agent loop over raw HTTP ([`agent`]).

#![allow(dead_code)] // each test binary uses its own part of this module

pub mod agent;
pub mod messages;
pub mod responses;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

// --- the scripted upstream -------------------------------------------------------------------

/// What the fake model server received, and a counter for call ids.
#[derive(Clone, Default)]
pub struct Fake {
    pub requests: Arc<Mutex<Vec<Value>>>,
    pub n: Arc<AtomicU64>,
    /// Paths (with queries) of requests to any route the fake does not serve.
    pub other_paths: Arc<Mutex<Vec<String>>>,
    /// Every request to `/v1/messages` and `/v1/responses`, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// The responses the Responses fake stored (`resp_N`, unless the request said `store:
    /// false`): the call ids each one issued, which a request continuing it must answer.
    pub stored: Arc<Mutex<HashMap<String, Vec<String>>>>,
    /// Every request received, on any route.
    pub hits: Arc<AtomicU64>,
}

/// One request the Anthropic or Responses fake received, and how it answered.
#[derive(Clone, Debug)]
pub struct Received {
    /// `messages` or `responses`.
    pub route: &'static str,
    pub headers: HeaderMap,
    pub body: Value,
    /// The status the fake answered with (400: the request broke the API's rules).
    pub status: u16,
    /// The whole answer, when the fake answered with JSON (plain responses and errors).
    pub answer: Option<Value>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub fake: Fake,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let fake = Fake::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(fake_chat))
            .route("/v1/messages", post(messages::fake_messages))
            .route("/v1/responses", post(responses::fake_responses))
            .route("/v1/models", get(fake_models))
            .route("/v1/models/{*id}", get(fake_models))
            .fallback(fake_other)
            .with_state(fake.clone())
            .layer(axum::middleware::from_fn_with_state(
                fake.clone(),
                count_hit,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream { addr, fake }
    }

    pub fn base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// How many requests the fake received, on any route.
    pub fn hits(&self) -> u64 {
        self.fake.hits.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Value> {
        self.fake.requests.lock().unwrap().clone()
    }

    /// The requests the fake received on `route` (`messages` or `responses`), in order.
    pub fn received(&self, route: &str) -> Vec<Received> {
        self.fake
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.route == route)
            .cloned()
            .collect()
    }
}

/// Counts every request the fake receives, whatever its route, and refuses keys starting
/// with `sk-invalid`.
async fn count_hit(
    State(f): State<Fake>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    f.hits.fetch_add(1, Ordering::SeqCst);
    // A key the fake does not accept: OpenAI's 401.
    let refused = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer sk-invalid"));
    if refused {
        return json_body(
            StatusCode::UNAUTHORIZED,
            &json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                "param": null, "code": "invalid_api_key"}}),
        );
    }
    next.run(request).await
}

/// Text that must reach the client unchanged: multi-byte characters (split across network reads
/// in a stream), escapes, markdown, a code fence, trailing whitespace.
pub const RICH: &str = "Résumé ✓ — naïve café 🙂 漢字\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n\
    ```rust\nfn main() { println!(\"{}\", \"\\\\\"); }\n```\n\ttab, \"quotes\", <html> &amp; \u{2028} end  ";

pub const BUILD: &str = r#"{"command":"cargo build"}"#;
pub const CHECK: &str = r#"{"command":"cargo check"}"#;

/// The text of the `chance` script's answer once it was told that its call failed the same way
/// (Anthropic and Responses fakes).
pub const CHANGED: &str = "That failed the same way: trying `cargo check` instead.";

/// What the proxy's second chance tells the upstream about the withheld call (the start of the
/// failed result's text): the fakes' `chance` script changes course when it reads it.
pub const TOLD: &str = "This exact call was just made";

pub fn tool_call(id: &str, name: &str, args: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
}

pub fn completion(model: &str, content: Value, calls: Vec<Value>) -> Value {
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}

/// The same turn as SSE events: text in two deltas, each call's arguments in 4-byte fragments.
pub fn stream_events(model: &str, text: Option<&str>, calls: &[Value]) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(t) = text {
        let mid = (0..=t.len() / 2)
            .rev()
            .find(|&i| t.is_char_boundary(i))
            .unwrap_or(0);
        out.push(chunk(json!({"content": &t[..mid]}), Value::Null));
        out.push(chunk(json!({"content": &t[mid..]}), Value::Null));
    }
    for (i, c) in calls.iter().enumerate() {
        let args = c["function"]["arguments"].as_str().unwrap();
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                "function": {"name": c["function"]["name"], "arguments": ""}}]}),
            Value::Null,
        ));
        for piece in pieces(args, 4) {
            out.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    out.push(chunk(json!({}), json!(finish)));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// `text` in pieces of about `size` bytes, cut at character boundaries.
pub fn pieces(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.char_indices() {
        if i - start >= size {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// An SSE body sent piece by piece, `pause` between pieces.
pub fn sse_body(events: Vec<String>, pause: Duration) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        for e in events {
            // Split each event in two writes, so that events also straddle reads.
            // Split each event in two writes at its middle byte, so that events (and, in
            // non-ASCII text, characters) also straddle reads.
            let bytes = Bytes::from(e);
            let half = bytes.len() / 2;
            for part in [bytes.slice(..half), bytes.slice(half..)] {
                if tx.send(part).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(pause).await;
        }
    });
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>))
    }));
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    r
}

pub fn json_body(status: StatusCode, v: &Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    r
}

/// The scripted model; `model` picks the script:
/// - `loop`: "Building." and the same `bash cargo build` call every turn;
/// - `pair`: a `read_file` of a new path and the same `bash` call every turn;
/// - `text`: a plain answer; `rich`: [`RICH`];
/// - `explore`: text and a `read_file` of a new path every turn (no loop);
/// - `converse`: after a tool result, reports the failure in text; otherwise the same `bash`
///   call (a conversational agent that a person answers every turn);
/// - `slow`: answers after 5 s; `slowstream`: one text chunk, then silence;
/// - `garbage`: a 200 that is not JSON; `limited`: a 429 with an OpenAI error;
/// - `flood`: a stream of [`FLOOD`] bytes of text, made as it is sent.
pub async fn fake_chat(State(f): State<Fake>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    f.requests.lock().unwrap().push(v.clone());
    let model = v["model"].as_str().unwrap_or_default().to_owned();
    let stream = v["stream"] == json!(true);
    let n = f.n.fetch_add(1, Ordering::SeqCst) + 1;
    let (text, calls): (Option<&str>, Vec<Value>) = match model.as_str() {
        "loop" => (
            Some("Building."),
            vec![tool_call(&format!("call_{n}"), "bash", BUILD)],
        ),
        // The same call, with no text beside it.
        "quietloop" => (None, vec![tool_call(&format!("call_{n}"), "bash", BUILD)]),
        // The same call, until told that it just failed the same way: then another.
        "chance" => {
            let told = v["messages"]
                .as_array()
                .and_then(|m| m.last())
                .is_some_and(|m| {
                    m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.contains(TOLD))
                });
            let args = if told { CHECK } else { BUILD };
            (None, vec![tool_call(&format!("call_{n}"), "bash", args)])
        }
        "converse" => {
            let last = v["messages"].as_array().and_then(|m| m.last()).cloned();
            if last.is_some_and(|m| m["role"] == "tool") {
                (Some("The build failed again."), Vec::new())
            } else {
                (None, vec![tool_call(&format!("call_{n}"), "bash", BUILD)])
            }
        }
        "pair" => (
            None,
            vec![
                tool_call(
                    &format!("read_{n}"),
                    "read_file",
                    &format!(r#"{{"path":"src/{n}.rs"}}"#),
                ),
                tool_call(&format!("call_{n}"), "bash", BUILD),
            ],
        ),
        // An agent without native tool calling: the same ReAct action every turn.
        "react" => (
            Some("Thought: I need to build it.\nAction: bash\nAction Input: cargo build"),
            Vec::new(),
        ),
        // The same, reading a new file each turn.
        "reactwalk" => {
            let text = format!(
                "Thought: I read the next file.\nAction: read_file\nAction Input: {{\"path\": \"src/{n}.rs\"}}"
            );
            let body = completion(&model, json!(text), Vec::new());
            return if stream {
                sse_body(
                    stream_events(&model, Some(&text), &[]),
                    Duration::from_millis(1),
                )
            } else {
                json_body(StatusCode::OK, &body)
            };
        }
        "text" => (Some("Hello! The answer is 42, see `ls -la`."), Vec::new()),
        "rich" => (Some(RICH), Vec::new()),
        "explore" => (
            Some("Reading the next file."),
            vec![tool_call(
                &format!("read_{n}"),
                "read_file",
                &format!(r#"{{"path": "src/módulo_{n}.rs", "note": "naïve \"quoted\" ✓"}}"#),
            )],
        ),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (Some("late"), Vec::new())
        }
        "slowstream" => {
            let mut events = stream_events(&model, Some("Thinking about it"), &[]);
            events.truncate(2);
            events.push(": still here\n\n".to_owned());
            return sse_body(events, Duration::from_secs(30));
        }
        "garbage" => {
            return (StatusCode::OK, "{\"choices\": [tru").into_response();
        }
        "flood" => return flood(&model, FLOOD),
        "limited" => {
            return json_body(
                StatusCode::TOO_MANY_REQUESTS,
                &json!({"error": {"message": "Rate limit reached", "type": "requests",
                    "param": null, "code": "rate_limit_exceeded"}}),
            );
        }
        other => panic!("no script for model {other}"),
    };
    if stream {
        sse_body(
            stream_events(&model, text, &calls),
            Duration::from_millis(1),
        )
    } else {
        json_body(StatusCode::OK, &completion(&model, json!(text), calls))
    }
}

/// How much text the `flood` script streams: more than the proxy holds back of a turn (64 MiB).
pub const FLOOD: usize = 80 << 20;

/// A chat stream of about `total` bytes of text in 64 KiB deltas, then a finish, each event
/// made as it is sent (the stream stops when the reader goes away).
pub fn flood(model: &str, total: usize) -> Response {
    let chunk = |delta: Value, finish: Value| {
        Bytes::from(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        ))
    };
    let text = chunk(json!({"content": "x".repeat(64 << 10)}), Value::Null);
    let n = total.div_ceil(text.len());
    let end = [
        chunk(json!({}), json!("stop")),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ];
    let events = std::iter::repeat_n(text, n).chain(end);
    let body = Body::from_stream(futures_util::stream::iter(events.map(Ok::<_, Infallible>)));
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    r
}

/// One scripted model turn of the Anthropic and Responses fakes: its text, and its calls as
/// (tool name, arguments as JSON text); at most one call, whose id is made from the number of
/// the request.
pub struct Scripted {
    pub text: Option<&'static str>,
    pub calls: Vec<(&'static str, String)>,
}

/// The Anthropic and Responses fakes' script for `model` at the fake's `n`-th request, as
/// [`fake_chat`]'s: `loop` ("Building." and the same `bash cargo build` call every turn),
/// `quietloop` (the same call, no text), `chance` ("Building." and the same call, until `told`
/// — the request ends with a failed result carrying the second chance's guidance — then
/// [`CHANGED`] and `cargo check`), `explore` (text and a `read_file` of a new path every turn:
/// no loop), `rich` ([`RICH`], no call), `text` (a short answer). `None`: no such model.
pub fn script(model: &str, n: u64, told: bool) -> Option<Scripted> {
    let (text, calls) = match model {
        "loop" => (Some("Building."), vec![("bash", BUILD.to_owned())]),
        "chance" if told => (Some(CHANGED), vec![("bash", CHECK.to_owned())]),
        "chance" => (Some("Building."), vec![("bash", BUILD.to_owned())]),
        "quietloop" => (None, vec![("bash", BUILD.to_owned())]),
        "explore" => (
            Some("Reading the next file."),
            vec![("read_file", explore_arguments(n))],
        ),
        "rich" => (Some(RICH), Vec::new()),
        "text" => (Some("Hello! The answer is 42, see `ls -la`."), Vec::new()),
        _ => return None,
    };
    Some(Scripted { text, calls })
}

/// The arguments of `explore`'s call at request `n`: non-ASCII, escapes, a new path each time.
pub fn explore_arguments(n: u64) -> String {
    format!(r#"{{"path": "src/módulo_{n}.rs", "note": "naïve \"quoted\" ✓"}}"#)
}

/// `text` in three pieces (fewer when it is shorter), cut at character boundaries: a stream's
/// text deltas.
pub fn thirds(text: &str) -> Vec<&str> {
    pieces(text, text.len().div_ceil(3).max(1))
}

/// One SSE event with its name, as Anthropic and the Responses API send them.
pub fn named_event(data: &Value) -> String {
    let name = data["type"].as_str().unwrap();
    format!("event: {name}\ndata: {data}\n\n")
}

/// Any other path: recorded, then 404.
pub async fn fake_other(State(f): State<Fake>, uri: axum::http::Uri) -> Response {
    f.other_paths.lock().unwrap().push(uri.to_string());
    json_body(
        StatusCode::NOT_FOUND,
        &json!({"error": {"message": "no such route"}}),
    )
}

pub async fn fake_models(headers: HeaderMap) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    json_body(
        StatusCode::OK,
        &json!({"object": "list", "data": [{"id": "loop", "object": "model"}], "seen_auth": auth}),
    )
}

// --- the real proxy ----------------------------------------------------------------------------

/// `loopctl proxy` as a child process, killed when dropped.
pub struct Proxy {
    pub child: Child,
    pub base: String,
    pub stderr: PathBuf,
    pub _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// Starts the proxy on a free port and waits until it reports its address.
    pub fn start(upstream: &str, args: &[&str]) -> Proxy {
        Proxy::spawn(upstream, args, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the proxy with `env` (other `LOOPGUARD_*` variables removed); on failure, says
    /// how it exited and what it printed.
    pub fn spawn(upstream: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Proxy, String> {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr.log");
        let mut cmd = loopguard_tests::proxy_command(&loopguard_tests::loopctl_path(), upstream);
        cmd.args(args)
            .stderr(std::fs::File::create(&stderr).unwrap());
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("start loopctl proxy");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let mut proxy = Proxy {
            child,
            base: String::new(),
            stderr,
            _dir: dir,
        };
        match line.trim().strip_prefix("loopctl proxy listening on ") {
            Some(base) => {
                proxy.base = base.to_owned();
                Ok(proxy)
            }
            None => {
                let status = proxy.child.wait().unwrap();
                Err(format!(
                    "the proxy did not start ({status}): stdout {line:?}, stderr:\n{}",
                    proxy.log()
                ))
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Polls /metrics until a series has `value` (readiness polling, not sleeping).
    pub async fn wait_metric(&self, series: &str, value: u64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let m = metrics(self).await;
            if metric(&m, series) == Some(value) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{series} never reached {value}:\n{m}\nstderr:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub async fn metrics(p: &Proxy) -> String {
    client()
        .get(p.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of one series line (`name{labels}`), if present.
pub fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A policy like `rules/proxy.yaml` with a default ladder: the 3rd identical call is warned,
/// the 4th refused, the 5th stops the run.
pub const POLICY: &str = r#"version: 1
name: proxy-test
escalation: { ladder: default }
ladders:
  default:
    - { repeat: 1, action: warn, message: "Loop detected: {tool} called {count} times with the same arguments. Change your approach." }
    - { repeat: 2, action: block, message: "Refused: {tool} called {count} times with the same arguments. The call was not run." }
    - { repeat: 3, action: terminate, message: "Stopped: {tool} kept being called with the same arguments ({count} times)." }
detectors:
  exact_repeat: { threshold: THRESHOLD }
  fuzzy_repeat: { enabled: false }
  cycle: { enabled: false }
  interleaved: { enabled: false }
  no_progress: { enabled: false }
  same_outcome: { enabled: false }
  error_cascade: { enabled: false }
  test_fix: { enabled: false }
  monologue: { enabled: false }
  text_repeat: { enabled: false }
  chanting: { enabled: false }
  unknown_tool: { enabled: false }
"#;

pub fn write_policy(dir: &Path, threshold: u32) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(&path, POLICY.replace("THRESHOLD", &threshold.to_string())).unwrap();
    path
}

/// The proxy with the test policy at `threshold`, and the directory holding the policy.
pub fn start(up: &Upstream, threshold: u32, extra: &[&str]) -> (Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), threshold);
    let mut args = vec!["--rules", policy.to_str().unwrap()];
    args.extend_from_slice(extra);
    (Proxy::start(&up.base(), &args), dir)
}

// --- the official Python clients -----------------------------------------------------------------

/// An agent loop on an official Python client: `tests/python/<script>`, on the package
/// `package` (`pin`: the version `scripts/test` installs), given the proxy's URL plus
/// `base_path` as its base URL (the Anthropic client adds `/v1` itself, the OpenAI one does
/// not).
#[derive(Clone, Copy)]
pub struct PythonAgent {
    pub script: &'static str,
    pub package: &'static str,
    pub pin: &'static str,
    pub base_path: &'static str,
}

/// Runs a Python agent against the proxy with `args`, and returns what it printed: one JSON
/// object per turn. Fails loudly when the client is not installed.
pub fn run_python_agent(proxy: &Proxy, agent: PythonAgent, args: &[String]) -> Vec<Value> {
    let PythonAgent {
        script,
        package,
        pin,
        base_path,
    } = agent;
    let root = loopguard_tests::root();
    let check = Command::new("python3")
        .args(["-c", &format!("import {package}")])
        .output()
        .expect("python3 must be installed to run the official client tests");
    assert!(
        check.status.success(),
        "the `{package}` Python package is missing: run `python3 -m pip install {package}=={pin}` \
         (scripts/test does)\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let out = Command::new("python3")
        .current_dir(&root)
        .arg(root.join("tests/python").join(script))
        .arg("--base")
        .arg(proxy.url(base_path))
        .args(args)
        .output()
        .expect("run the Python agent");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nproxy log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        proxy.log()
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// [`run_python_agent`] off the async runtime (the upstream is served on it meanwhile).
pub async fn python_agent(proxy: &Arc<Proxy>, agent: PythonAgent, args: &[&str]) -> Vec<Value> {
    let proxy = Arc::clone(proxy);
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run_python_agent(&proxy, agent, &args))
        .await
        .unwrap()
}
