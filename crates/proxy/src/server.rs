//! The HTTP side: routes, forwarding to the upstream, streaming, operations endpoints.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as Extract;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant as Deadline, timeout, timeout_at};

use crate::error::{ApiError, json_response};
use crate::judge::rewrite_response;
use crate::state::{Prepared, State, Turn, TurnJudge};
use crate::stream::StreamJudge;

/// Largest non-streaming upstream body read.
const MAX_UPSTREAM_BODY: usize = 64 << 20;

type Shared = Arc<State>;

/// Every route the proxy serves.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{*id}", get(models))
        .route("/models/{*id}", get(models))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(unsupported)
        .method_not_allowed_fallback(unsupported)
        .with_state(state)
}

async fn healthz(Extract(state): Extract<Shared>) -> Response {
    state.metrics.request("healthz");
    let guard = state.guard();
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "policy": guard.policy.name,
            "upstream": state.upstream.shown(),
            "sessions": state.session_count(),
        }),
    )
}

async fn metrics(Extract(state): Extract<Shared>) -> Response {
    state.metrics.request("metrics");
    let mut resp = state.metrics.render(state.session_count()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn unsupported(Extract(state): Extract<Shared>, method: Method, uri: Uri) -> Response {
    state.metrics.request("other");
    let path = uri.path();
    let known = [
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/models",
        "/models",
        "/healthz",
        "/metrics",
    ];
    if known.contains(&path) || path.starts_with("/v1/models/") || path.starts_with("/models/") {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("`{method} {path}` is not served: use POST for chat completions and GET for the rest"),
        )
        .into_response();
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unsupported_path",
        format!(
            "`{method} {path}` is not proxied: loopguard serves POST /v1/chat/completions, \
             GET /v1/models, GET /healthz and GET /metrics; send other requests to the upstream \
             directly"
        ),
    )
    .into_response()
}

/// Request headers not forwarded: hop-by-hop ones, ours, and those the proxy sets itself.
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    const SKIP: &[&str] = &[
        "host",
        "content-length",
        "content-type",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "accept-encoding",
        crate::session::HEADER,
    ];
    headers
        .iter()
        .filter(|(k, _)| !SKIP.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Upstream response headers passed back (request ids, rate limits).
fn passed_back(from: &HeaderMap, to: &mut HeaderMap) {
    for (k, v) in from {
        let name = k.as_str();
        if name == "x-request-id"
            || name == "retry-after"
            || name.starts_with("x-ratelimit-")
            || name.starts_with("openai-")
        {
            to.insert(k.clone(), v.clone());
        }
    }
}

/// Reads a request body of at most `limit` bytes; a pause longer than `pause` between its
/// parts is a 408.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    pause: Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body is larger than the proxy's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::with_capacity(declared.unwrap_or(0));
    loop {
        let Ok(next) = timeout(pause, stream.next()).await else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "request_timeout",
                format!(
                    "the request body paused for more than {} s",
                    pause.as_secs_f64()
                ),
            ));
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| {
            ApiError::invalid_request(
                "unreadable_body",
                format!("could not read the request body: {e}"),
            )
        })?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

fn upstream_failure(state: &State, e: &reqwest::Error, what: &str) -> ApiError {
    let secs = state.options.timeout.as_secs_f64();
    if e.is_timeout() {
        state.metrics.upstream_error("timeout");
        return ApiError::upstream(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            format!("the upstream did not answer {what} within {secs} s"),
        );
    }
    state.metrics.upstream_error("unreachable");
    // The request error's own text names the URL (credentials included): only its causes
    // are shown, and those with the URL's credentials replaced.
    let mut cause = String::from(if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    });
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = format!("{cause}: {s}");
        source = s.source();
    }
    ApiError::upstream(
        StatusCode::BAD_GATEWAY,
        "upstream_unreachable",
        format!(
            "cannot reach the upstream {}: {}",
            state.upstream.shown(),
            state.upstream.redact(&cause)
        ),
    )
}

fn timed_out(state: &State, what: &str) -> ApiError {
    state.metrics.upstream_error("timeout");
    ApiError::upstream(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_timeout",
        format!(
            "the upstream did not answer {what} within {} s",
            state.options.timeout.as_secs_f64()
        ),
    )
}

/// Reads a whole upstream body, bounded in size and by the deadline.
async fn read_upstream(
    state: &State,
    mut resp: reqwest::Response,
    deadline: Deadline,
) -> Result<Vec<u8>, ApiError> {
    let mut buf = Vec::new();
    loop {
        match timeout_at(deadline, resp.chunk()).await {
            Err(_) => return Err(timed_out(state, "in full")),
            Ok(Err(e)) => return Err(upstream_failure(state, &e, "in full")),
            Ok(Ok(None)) => return Ok(buf),
            Ok(Ok(Some(b))) => {
                if buf.len() + b.len() > MAX_UPSTREAM_BODY {
                    state.metrics.upstream_error("malformed");
                    return Err(ApiError::upstream(
                        StatusCode::BAD_GATEWAY,
                        "upstream_malformed",
                        format!("the upstream response is larger than {MAX_UPSTREAM_BODY} bytes"),
                    ));
                }
                buf.extend_from_slice(&b);
            }
        }
    }
}

/// An upstream error status: its body is passed back when it is JSON (normally an OpenAI
/// envelope already), else wrapped in one.
async fn pass_error(state: &State, resp: reqwest::Response, deadline: Deadline) -> Response {
    state.metrics.upstream_error("status");
    let status = resp.status();
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers);
    let body = match read_upstream(state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    tracing::warn!(
        status = status.as_u16(),
        "the upstream answered with an error"
    );
    let mut out = if serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.get("error").is_some())
    {
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    } else {
        let text = String::from_utf8_lossy(&body);
        let snippet: String = text.chars().take(300).collect();
        ApiError::new(
            status,
            "upstream_error",
            "upstream_status",
            format!("the upstream answered {status}: {}", snippet.trim()),
        )
        .into_response()
    };
    out.headers_mut().extend(headers);
    out
}

async fn chat(Extract(state): Extract<Shared>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    state.metrics.request("chat_completions");
    let resp = chat_inner(&state, &headers, body, started).await;
    if resp.extensions().get::<Pumped>().is_none() {
        state.metrics.observe_latency(started.elapsed());
    }
    resp
}

async fn chat_inner(state: &Shared, headers: &HeaderMap, body: Body, started: Instant) -> Response {
    let bytes = match read_body(
        headers,
        body,
        state.options.max_body_bytes,
        state.options.header_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            if e.status == StatusCode::REQUEST_TIMEOUT {
                state.metrics.slow_client();
            }
            return e.into_response();
        }
    };
    let mut json: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return ApiError::invalid_request(
                "invalid_body",
                "the request body must be a JSON object",
            )
            .into_response();
        }
        Err(e) => {
            return ApiError::invalid_request(
                "invalid_json",
                format!("the request body is not valid JSON: {e}"),
            )
            .into_response();
        }
    };
    let turn = match state.prepare(headers, &mut json) {
        Prepared::Fail(e) => return e.into_response(),
        Prepared::Reply(turn, text) => return reply(state, &turn, &text),
        Prepared::Forward(turn) => turn,
    };
    tracing::debug!(session = ?turn.session, model = turn.model.as_deref().unwrap_or("-"), stream = turn.stream, "forwarding a chat completion");
    let url = state.upstream.endpoint(["chat", "completions"], None);
    let deadline = Deadline::now() + state.options.timeout;
    let body = match serde_json::to_vec(&json) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::invalid_request("invalid_body", e.to_string()).into_response();
        }
    };
    let request = state
        .client
        .post(url)
        .headers(forwarded(headers))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    let resp = match timeout_at(deadline, request.send()).await {
        Err(_) => return timed_out(state, "with response headers").into_response(),
        Ok(Err(e)) => return upstream_failure(state, &e, "with response headers").into_response(),
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        return pass_error(state, resp, deadline).await;
    }
    let is_sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let judge = TurnJudge::new(Arc::clone(state), turn);
    if is_sse {
        return stream(state, resp, judge, started).await;
    }
    let status = resp.status();
    let client_headers = headers;
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers);
    let raw = match read_upstream(state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let mut value: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => {
            state.metrics.upstream_error("malformed");
            tracing::warn!(error = %e, "the upstream answered with malformed JSON");
            return ApiError::upstream(
                StatusCode::BAD_GATEWAY,
                "upstream_malformed",
                format!("the upstream answered with malformed JSON: {e}"),
            )
            .into_response();
        }
    };
    let mut original = value.clone();
    let mut judge = judge;
    let mut done = match rewrite_response(&mut value, &mut judge) {
        Ok(done) => done,
        Err(e) => {
            if e.code == "upstream_malformed" {
                state.metrics.upstream_error("malformed");
            }
            return e.into_response();
        }
    };
    let mut raw = raw;
    if let Some((call, guidance)) = judge.second_chance() {
        // chance_then_break: the repeated call is withheld; the upstream hears that it failed
        // and is asked once more, within this request. Its second answer goes to the client as
        // if it were the first (the same call again is refused by the ladder's next step).
        match second_answer(
            state,
            client_headers,
            &json,
            &original,
            &call,
            &guidance,
            deadline,
        )
        .await
        {
            Some((again_raw, again)) => {
                judge.retried = true;
                let mut rewritten = again.clone();
                match rewrite_response(&mut rewritten, &mut judge) {
                    Ok(again_done) => {
                        let repeated = again_done
                            .iter()
                            .any(|i| i.tool_call_id.is_some() && i.action != "warn");
                        state
                            .metrics
                            .second_chance(if repeated { "repeated" } else { "changed" });
                        original = again;
                        value = rewritten;
                        raw = again_raw;
                        done = again_done;
                    }
                    Err(e) => return e.into_response(),
                }
            }
            None => state.metrics.second_chance("failed"),
        }
    }
    if !done.is_empty()
        && let Some(obj) = value.as_object_mut()
    {
        obj.insert("loopguard".into(), crate::judge::body_field(&done));
    }
    let mut out = if value == original {
        // Nothing changed: the client gets the upstream's bytes.
        let mut r = (status, raw).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    } else {
        json_response(status, &value)
    };
    out.headers_mut().extend(headers);
    set_intervention_headers(&mut out, &done);
    out
}

/// The upstream's second answer for a turn whose lone call was a repeat given a second chance:
/// the request again, with the withheld call and a failed tool result carrying `guidance`
/// appended. `None` when it cannot be had (the first answer then stands).
async fn second_answer(
    state: &Shared,
    headers: &HeaderMap,
    request: &Value,
    first: &Value,
    call: &crate::judge::CallIn,
    guidance: &str,
    deadline: Deadline,
) -> Option<(Vec<u8>, Value)> {
    let message = first.get("choices")?.get(0)?.get("message")?.clone();
    let mut body = request.clone();
    let messages = body.get_mut("messages")?.as_array_mut()?;
    messages.push(message);
    messages.push(serde_json::json!({
        "role": "tool",
        "tool_call_id": call.id,
        "content": guidance,
    }));
    let bytes = serde_json::to_vec(&body).ok()?;
    let url = state.upstream.endpoint(["chat", "completions"], None);
    let resp = timeout_at(
        deadline,
        state
            .client
            .post(url)
            .headers(forwarded(headers))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .send(),
    )
    .await
    .ok()?
    .ok()?;
    if !resp.status().is_success() {
        state.metrics.upstream_error("status");
        return None;
    }
    let raw = read_upstream(state, resp, deadline).await.ok()?;
    let value = serde_json::from_slice(&raw).ok()?;
    tracing::info!(tool = ?call.name, "a repeated call was withheld and the upstream asked once more");
    Some((raw, value))
}

/// The `x-loopguard-*` headers of a response the proxy changed (the most severe intervention).
fn set_intervention_headers(out: &mut Response, done: &[crate::judge::Intervention]) {
    for (name, value) in crate::judge::headers(done).into_iter().flatten() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            out.headers_mut().insert(name, v);
        }
    }
}

/// Marks a response whose latency the stream's task records when the stream ends.
#[derive(Clone, Copy, Debug)]
struct Pumped;

/// Streams an SSE response through the [`StreamJudge`]; a task reads the upstream so that a
/// client that goes away is noticed at once and the upstream request is dropped with it.
/// Longest a stream is held back waiting for something the client must see (see [`stream`]).
const HOLD_MAX: Duration = Duration::from_secs(5);

/// What the pump hands the response: bytes of the stream, or (before any byte was sent) the
/// error that stops the session, answered with the same status as a plain request gets.
#[derive(Debug)]
enum Piece {
    Data(Bytes),
    Stop(ApiError),
}

/// A streamed response. Nothing is sent until the stream has something the client must see
/// (text, a released call, a finish), or for at most [`HOLD_MAX`] (half the upstream timeout if
/// shorter): a stop decided before that is a plain error response, the same status and body as
/// without streaming; once bytes have gone out it is the stream's last event.
async fn stream(
    state: &Shared,
    resp: reqwest::Response,
    judge: TurnJudge,
    started: Instant,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Piece>(32);
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers);
    let session = judge.turn.session.clone();
    tokio::spawn(pump(
        Arc::clone(state),
        resp,
        StreamJudge::new(judge),
        tx,
        session,
        started,
    ));
    let first = match rx.recv().await {
        Some(Piece::Stop(e)) => {
            let mut out = e.into_response();
            out.extensions_mut().insert(Pumped);
            return out;
        }
        Some(Piece::Data(b)) => Some(b),
        None => None,
    };
    let mut first = first;
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| {
        if let Some(b) = first.take() {
            return std::task::Poll::Ready(Some(Ok::<_, Infallible>(b)));
        }
        rx.poll_recv(cx).map(|p| match p {
            Some(Piece::Data(b)) => Some(Ok(b)),
            // The pump sends a stop only before any data.
            Some(Piece::Stop(e)) => Some(Ok(Bytes::from(e.sse_event()))),
            None => None,
        })
    }));
    let mut out = Response::new(body);
    let h = out.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.extend(headers);
    out.extensions_mut().insert(Pumped);
    out
}

async fn pump(
    state: Shared,
    mut resp: reqwest::Response,
    mut sj: StreamJudge<TurnJudge>,
    tx: mpsc::Sender<Piece>,
    session: String,
    started: Instant,
) {
    let idle = state.options.timeout;
    let secs = idle.as_secs_f64();
    let mut gone = false;
    // Events held until the client must see something, for at most HOLD_MAX (see [`stream`]).
    let mut held: Vec<String> = Vec::new();
    let mut open = false;
    let hold_until = tokio::time::Instant::now() + HOLD_MAX.min(idle / 2);
    loop {
        let next = tokio::select! {
            () = tx.closed() => { gone = true; break; }
            () = tokio::time::sleep_until(hold_until), if !open => {
                // Held long enough: the stream opens (a comment if there is nothing yet, so
                // that the client gets its headers); a later stop is its last event.
                open = true;
                let mut ready = std::mem::take(&mut held);
                if ready.is_empty() {
                    ready.push(": loopguard\n\n".to_owned());
                }
                for e in ready {
                    if tx.send(Piece::Data(Bytes::from(e))).await.is_err() {
                        gone = true;
                        break;
                    }
                }
                if gone {
                    break;
                }
                continue;
            }
            r = timeout(idle, resp.chunk()) => r,
        };
        let (events, last) = match next {
            Err(_) => {
                state.metrics.upstream_error("timeout");
                let e = ApiError::upstream(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    format!("the upstream stream stalled: nothing for {secs} s"),
                );
                (vec![e.sse_event()], true)
            }
            Ok(Err(e)) => {
                state.metrics.upstream_error("interrupted");
                let e = ApiError::upstream(
                    StatusCode::BAD_GATEWAY,
                    "upstream_interrupted",
                    format!("the upstream stream broke off: {e}"),
                );
                (vec![e.sse_event()], true)
            }
            Ok(Ok(None)) => (sj.finish(), true),
            Ok(Ok(Some(bytes))) => (sj.push(&bytes), false),
        };
        let ready = if open {
            events
        } else if let Some(e) = sj.terminated.clone() {
            // Stopped before anything was sent: a plain error response.
            if tx.send(Piece::Stop(e)).await.is_err() {
                gone = true;
            }
            break;
        } else {
            held.extend(events);
            if !(sj.committed || last || sj.is_closed()) {
                continue;
            }
            open = true;
            std::mem::take(&mut held)
        };
        for e in ready {
            if tx.send(Piece::Data(Bytes::from(e))).await.is_err() {
                gone = true;
                break;
            }
        }
        if gone || last || sj.is_closed() {
            break;
        }
    }
    if sj.malformed {
        state.metrics.upstream_error("malformed");
    }
    if sj.upstream_error {
        state.metrics.upstream_error("status");
    }
    if gone {
        state.metrics.client_disconnect();
        tracing::info!(
            session = ?session,
            unreleased_calls = sj.abandon(),
            "the client went away mid-stream; the upstream request is dropped"
        );
    }
    state.metrics.observe_latency(started.elapsed());
}

/// The proxy's own answer (to in-chat commands), shaped as the client asked: a completion or a
/// stream of chunks.
fn reply(state: &State, turn: &Turn, text: &str) -> Response {
    let id = state.completion_id();
    let created = crate::state::now_ms() / 1000;
    let model = turn.model.as_deref().unwrap_or("loopguard");
    if !turn.stream {
        return json_response(
            StatusCode::OK,
            &json!({
                "id": id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": "stop",
                }],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }),
        );
    }
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            })
        )
    };
    let body = [
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let mut out = Response::new(Body::from(body));
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    out
}

async fn models(Extract(state): Extract<Shared>, uri: Uri, headers: HeaderMap) -> Response {
    state.metrics.request("models");
    let path = uri.path();
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let id = rest.strip_prefix("/models").unwrap_or(rest);
    let mut segments = vec!["models".to_owned()];
    if let Some(id) = id.strip_prefix('/') {
        let Some(more) = crate::upstream::model_segments(id) else {
            return ApiError::invalid_request(
                "invalid_model_id",
                "a model id in the path may not have empty, `.` or `..` segments",
            )
            .into_response();
        };
        segments.extend(more);
    }
    let url = state
        .upstream
        .endpoint(segments.iter().map(String::as_str), uri.query());
    let deadline = Deadline::now() + state.options.timeout;
    let request = state.client.get(url).headers(forwarded(&headers));
    let resp = match timeout_at(deadline, request.send()).await {
        Err(_) => return timed_out(&state, "with response headers").into_response(),
        Ok(Err(e)) => return upstream_failure(&state, &e, "with response headers").into_response(),
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        return pass_error(&state, resp, deadline).await;
    }
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers);
    let body = match read_upstream(&state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let mut out = (status, body).into_response();
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    out.headers_mut().extend(headers);
    out
}

/// How long `serve` waits for open connections after a shutdown signal.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
