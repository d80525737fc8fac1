//! The HTTP side: routes, forwarding to the upstream, streaming, operations endpoints.
//!
//! One handler serves every wire format ([`Wire`]): it reads the request, has the state judge
//! what is new in it, forwards it, and judges the answer, whole or streamed, with the format's
//! rewriter. Other upstream routes clients call beside them (the model list, Anthropic's token
//! count, stored Responses) are passed through unjudged.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as Extract;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant as Deadline, timeout, timeout_at};

use crate::error::{ApiError, json_response};
use crate::judge::Intervention;
use crate::redact::Secrets;
use crate::state::{Prepared, State, Turn, TurnJudge};
use crate::wire::{Rewriter, Rewritten, Wire};

/// Largest non-streaming upstream body read.
const MAX_UPSTREAM_BODY: usize = 64 << 20;

/// Most of a streamed turn held back before anything of it is sent to the client (a turn held
/// whole for a second chance, or its first events while a stop may still come): the limit of a
/// non-streaming body, which a held turn stands in for. Each held event counts its bytes and
/// the size of its string, so many empty events are bounded too.
const MAX_HELD: usize = MAX_UPSTREAM_BODY;

type Shared = Arc<State>;

/// Every route the proxy serves.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/messages", post(messages))
        .route("/messages", post(messages))
        .route("/v1/responses", post(responses))
        .route("/responses", post(responses))
        .route("/v1/messages/count_tokens", post(passthrough))
        .route("/v1/responses/{*rest}", any(passthrough))
        .route("/v1/models", get(passthrough))
        .route("/models", get(passthrough))
        .route("/v1/models/{*id}", get(passthrough).post(gemini))
        .route("/models/{*id}", get(passthrough).post(gemini))
        .route("/v1beta/models", get(passthrough))
        .route("/v1beta/models/{*id}", get(passthrough).post(gemini))
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

/// The paths the proxy serves, for error messages.
const SERVED: &str = "POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, \
     POST /v1beta/models/{model}:generateContent and :streamGenerateContent (and the routes \
     beside them: GET /v1/models, POST /v1/messages/count_tokens, /v1/responses/{id}, \
     GET /v1beta/models, POST /v1beta/models/{model}:countTokens), GET /healthz and GET /metrics";

async fn unsupported(Extract(state): Extract<Shared>, method: Method, uri: Uri) -> Response {
    state.metrics.request("other");
    let path = uri.path();
    let known = [
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/messages",
        "/messages",
        "/v1/responses",
        "/responses",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/models",
        "/v1beta/models",
        "/healthz",
        "/metrics",
    ];
    let wire = if path.starts_with("/v1beta/") {
        Wire::Gemini
    } else {
        Wire::Chat
    };
    if known.contains(&path)
        || path.starts_with("/v1/models/")
        || path.starts_with("/models/")
        || path.starts_with("/v1beta/models/")
    {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("`{method} {path}` is not served: the proxy serves {SERVED}"),
        )
        .response(wire);
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unsupported_path",
        format!(
            "`{method} {path}` is not proxied: loopguard serves {SERVED}; send other requests \
             to the upstream directly"
        ),
    )
    .response(wire)
}

/// Request headers not forwarded: hop-by-hop ones, ours, and those the proxy sets itself.
/// Everything else goes on as the client sent it (`authorization`, `x-api-key`,
/// `anthropic-version`, `anthropic-beta`, `openai-organization`, …).
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

/// Upstream response headers passed back (request ids, rate limits), each value with the
/// request's credentials (`secrets`) replaced. None is hop-by-hop (`connection`,
/// `transfer-encoding`, …, and any the upstream's `connection` names) or describes the body
/// (`content-length`): the proxy's own response sets those for the body it sends, changed or
/// not. A header whose name holds a credential is dropped.
fn passed_back(from: &HeaderMap, to: &mut HeaderMap, secrets: &Secrets) {
    let hop_by_hop: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for (k, v) in from {
        let name = k.as_str();
        let wanted = name == "x-request-id"
            || name == "request-id"
            || name == "retry-after"
            || name.starts_with("x-ratelimit-")
            || name.starts_with("anthropic-ratelimit-")
            || name.starts_with("openai-");
        if !wanted || hop_by_hop.iter().any(|h| h == name) || secrets.in_name(name) {
            continue;
        }
        to.insert(k.clone(), secrets.header(v).unwrap_or_else(|| v.clone()));
    }
}

/// The slowest a request body may arrive on average, past its first `pause`: a client that
/// trickles a body a few bytes at a time holds a connection slot no longer than `pause` plus
/// one second per this many bytes it sent.
pub(crate) const MIN_BODY_RATE: u64 = 64 << 10;

/// Reads a request body of at most `limit` bytes; a pause longer than `pause` between its
/// parts is a 408, and so is a body slower on average than [`MIN_BODY_RATE`] once `pause` has
/// passed (its next part is due by `pause` plus a second per [`MIN_BODY_RATE`] bytes read).
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
    let started = Deadline::now();
    loop {
        let read = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        let earned = Duration::from_secs(read / MIN_BODY_RATE);
        let due = (started + pause + earned).min(Deadline::now() + pause);
        let Ok(next) = timeout_at(due, stream.next()).await else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "request_timeout",
                format!(
                    "the request body paused for more than {} s, or came slower than {} KiB/s",
                    pause.as_secs_f64(),
                    MIN_BODY_RATE >> 10
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

fn malformed(state: &State, what: String) -> ApiError {
    state.metrics.upstream_error("malformed");
    tracing::warn!(what = %what, "the upstream answered with something the proxy cannot read");
    ApiError::upstream(
        StatusCode::BAD_GATEWAY,
        "upstream_malformed",
        format!("the upstream answered with a malformed response: {what}"),
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
                    return Err(malformed(
                        state,
                        format!("the response is larger than {MAX_UPSTREAM_BODY} bytes"),
                    ));
                }
                buf.extend_from_slice(&b);
            }
        }
    }
}

/// An upstream error status: its body is passed back when it is JSON (normally the format's
/// error envelope already), else wrapped in one; either way with the request's credentials
/// (`secrets`) replaced, inside JSON strings only.
async fn pass_error(
    state: &State,
    wire: Wire,
    resp: reqwest::Response,
    deadline: Deadline,
    secrets: &Secrets,
) -> Response {
    state.metrics.upstream_error("status");
    let status = resp.status();
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers, secrets);
    let body = match read_upstream(state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => return e.response(wire),
    };
    tracing::warn!(
        status = status.as_u16(),
        "the upstream answered with an error"
    );
    let mut parsed = serde_json::from_slice::<Value>(&body).ok();
    // The body as parsed, once redacted, whenever the body as written quotes a credential the
    // parsed value does not hold (a duplicate key, whose last copy is all a parser keeps).
    let redacted = parsed.as_mut().is_some_and(|v| secrets.value(v))
        || (parsed.is_some() && secrets.quoted_in(&String::from_utf8_lossy(&body)));
    let mut out = if let Some(v) = parsed.as_ref().filter(|v| v.get("error").is_some()) {
        let body = if redacted {
            v.to_string().into_bytes()
        } else {
            body
        };
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    } else {
        let text = match parsed {
            Some(v) if redacted => v.to_string(),
            _ => secrets.text(&String::from_utf8_lossy(&body)).into_owned(),
        };
        let snippet: String = text.chars().take(300).collect();
        ApiError::new(
            status,
            "upstream_error",
            "upstream_status",
            format!("the upstream answered {status}: {}", snippet.trim()),
        )
        .response(wire)
    };
    out.headers_mut().extend(headers);
    out
}

/// Runs judging work where it may block: off the async workers (so other sessions' requests
/// go on) when it may take time (plugins, a shared session store), in place otherwise.
fn judging<T>(state: &State, f: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi && state.blocks() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

async fn chat(Extract(state): Extract<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(Wire::Chat, state, headers, body).await
}

async fn messages(Extract(state): Extract<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(Wire::Messages, state, headers, body).await
}

async fn responses(Extract(state): Extract<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(Wire::Responses, state, headers, body).await
}

async fn handle(wire: Wire, state: Shared, headers: HeaderMap, body: Body) -> Response {
    let routed = Routed {
        target: Target::of(wire),
        given: None,
        array: false,
        ident: headers.clone(),
    };
    handle_routed(wire, state, headers, body, routed).await
}

/// The Gemini methods the proxy judges, and those it passes through unjudged.
const GEMINI_JUDGED: [&str; 2] = ["generateContent", "streamGenerateContent"];
const GEMINI_PASSED: [&str; 3] = ["countTokens", "embedContent", "batchEmbedContents"];

/// `POST …/models/{model}:{method}`: Gemini's `generateContent` and `streamGenerateContent`
/// are judged (the path goes to the upstream as it came, under its base, with the client's
/// query); `countTokens` and the embedding methods pass through.
async fn gemini(
    Extract(state): Extract<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = uri.path();
    let last = path.rsplit('/').next().unwrap_or_default();
    let last = percent_encoding::percent_decode_str(last).decode_utf8_lossy();
    let (model, verb) = last.rsplit_once(':').unwrap_or((&last, ""));
    if GEMINI_PASSED.contains(&verb) {
        return passthrough(Extract(state), method, uri, headers, body).await;
    }
    if !GEMINI_JUDGED.contains(&verb) {
        state.metrics.request("other");
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unsupported_path",
            format!(
                "`{method} {path}` is not proxied: loopguard serves {SERVED}; send other \
                 requests to the upstream directly"
            ),
        )
        .response(Wire::Gemini);
    }
    let query = uri.query().map(str::to_owned);
    // `alt=sse` streams events; `streamGenerateContent` without it answers with a JSON array,
    // which is judged whole.
    let sse = query_pairs(query.as_deref())
        .iter()
        .any(|(k, v)| k == "alt" && v == "sse");
    let stream = verb == "streamGenerateContent" && sse;
    let Some(segments) = path
        .strip_prefix('/')
        .and_then(crate::upstream::model_segments)
    else {
        state.metrics.request(Wire::Gemini.name());
        let e = ApiError::invalid_request(
            "invalid_path",
            "a path may not have empty, `.` or `..` segments",
        );
        return refused(&state, Wire::Gemini.name(), e).response(Wire::Gemini);
    };
    let routed = Routed {
        target: Target { segments, query },
        given: Some((Some(model.to_owned()).filter(|m| !m.is_empty()), stream)),
        array: verb == "streamGenerateContent" && !sse,
        ident: with_query_key(&headers, uri.query()),
    };
    handle_routed(Wire::Gemini, state, headers, body, routed).await
}

/// The name/value pairs of a query, decoded (`+` is a space).
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `headers` with the `key` query parameter (Gemini's other place for the API key) read into
/// `x-goog-api-key`, when the header is not there: the caller is known by it and it is
/// redacted like any header credential.
fn with_query_key(headers: &HeaderMap, query: Option<&str>) -> HeaderMap {
    let mut out = headers.clone();
    if out.contains_key("x-goog-api-key") {
        return out;
    }
    let key = query_pairs(query)
        .into_iter()
        .find(|(k, v)| k == "key" && !v.is_empty())
        .map(|(_, v)| v);
    if let Some(v) = key.and_then(|k| HeaderValue::from_str(&k).ok()) {
        out.insert("x-goog-api-key", v);
    }
    out
}

async fn handle_routed(
    wire: Wire,
    state: Shared,
    headers: HeaderMap,
    body: Body,
    routed: Routed,
) -> Response {
    let started = Instant::now();
    state.metrics.request(wire.name());
    if let Some(refused) = keyless(&state, &routed.ident, wire, wire.name()) {
        return refused;
    }
    let resp = handle_inner(wire, &state, &headers, body, routed, started).await;
    if resp.extensions().get::<Pumped>().is_none() {
        state.metrics.observe_latency(started.elapsed());
    }
    resp
}

/// Under [`Options::require_key`](crate::Options::require_key), the answer to a request bound
/// for the upstream that carries no API key: a 401 in `wire`'s error shape, counted under
/// `route`. It is decided from the headers alone, before the body is read. `None`: the request
/// goes on.
fn keyless(
    state: &State,
    headers: &HeaderMap,
    wire: Wire,
    route: &'static str,
) -> Option<Response> {
    if !state.options.require_key || crate::session::credential(headers).is_some() {
        return None;
    }
    state.metrics.refused(route, crate::error::MISSING_API_KEY);
    tracing::debug!(route, "a request without an API key was refused");
    let mut out = ApiError::missing_key(wire).response(wire);
    out.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(out)
}

/// Counts a request refused as unreadable (too large, too slow, not JSON, not the route's
/// shape) under `route` and the error's code, and hands the error back.
fn refused(state: &State, route: &str, e: ApiError) -> ApiError {
    state.metrics.refused(route, e.code);
    e
}

/// Where a request goes under the upstream's base: path segments and the client's query.
#[derive(Clone, Debug)]
struct Target {
    segments: Vec<String>,
    query: Option<String>,
}

impl Target {
    /// The endpoint of `wire` (whose path is fixed), without a query.
    fn of(wire: Wire) -> Target {
        Target {
            segments: wire
                .upstream_path()
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            query: None,
        }
    }
}

/// What the route of a request says about it beside its body (Gemini's path and query).
struct Routed {
    /// Where it goes upstream.
    target: Target,
    /// The model and whether it streams, when the path says so.
    given: Option<(Option<String>, bool)>,
    /// The answer is Gemini's JSON array of responses (`streamGenerateContent` without
    /// `alt=sse`).
    array: bool,
    /// The headers the caller is known by and whose credentials are redacted: the request's,
    /// with a `key` query parameter read into `x-goog-api-key`. The request's own headers are
    /// what is forwarded.
    ident: HeaderMap,
}

/// Sends a request body to the upstream at `target`.
async fn send(
    state: &State,
    target: &Target,
    headers: &HeaderMap,
    body: Bytes,
    deadline: Deadline,
) -> Result<reqwest::Response, ApiError> {
    let url = state.upstream.endpoint(
        target.segments.iter().map(String::as_str),
        target.query.as_deref(),
    );
    let request = state
        .client
        .post(url)
        .headers(forwarded(headers))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    match timeout_at(deadline, request.send()).await {
        Err(_) => Err(timed_out(state, "with response headers")),
        Ok(Err(e)) => Err(upstream_failure(state, &e, "with response headers")),
        Ok(Ok(r)) => Ok(r),
    }
}

fn is_sse(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

async fn handle_inner(
    wire: Wire,
    state: &Shared,
    headers: &HeaderMap,
    body: Body,
    routed: Routed,
    started: Instant,
) -> Response {
    let Routed {
        target,
        given,
        array,
        ident,
    } = routed;
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
            return refused(state, wire.name(), e).response(wire);
        }
    };
    let mut body = match wire.body(&bytes) {
        Ok(b) => b,
        Err(e) => {
            let e = ApiError::invalid_request("invalid_json", e.0);
            return refused(state, wire.name(), e).response(wire);
        }
    };
    let turn = match judging(state, || state.prepare_for(wire, &ident, &mut body, given)) {
        // A request the proxy cannot read is refused; a loop's end is an answer.
        Prepared::Fail(e) if e.kind == "invalid_request_error" => {
            return refused(state, wire.name(), e).response(wire);
        }
        Prepared::Fail(e) => return e.response(wire),
        Prepared::Reply(turn, text) => return reply(state, &turn, &text, array),
        Prepared::Forward(turn) => *turn,
    };
    tracing::debug!(session = ?turn.session, model = turn.model.as_deref().unwrap_or("-"), stream = turn.stream, format = wire.name(), "forwarding");
    let deadline = Deadline::now() + state.options.timeout;
    let sent = if turn.body_changed {
        Bytes::from(body.to_bytes())
    } else {
        // Nothing changed: the upstream gets the client's bytes.
        bytes.clone()
    };
    let resp = match send(state, &target, headers, sent.clone(), deadline).await {
        Ok(r) => r,
        Err(e) => {
            judging(state, || state.settle_turn(&turn));
            return e.response(wire);
        }
    };
    let secrets = Secrets::of(&ident, &state.upstream);
    if !resp.status().is_success() {
        judging(state, || state.settle_turn(&turn));
        return pass_error(state, wire, resp, deadline, &secrets).await;
    }
    state.upstream_accepted(&turn.session);
    let judge = TurnJudge::new(Arc::clone(state), turn).with_secrets(secrets);
    // What a second chance asks the upstream again with: the request as it was sent.
    let retry = Retry {
        request: sent,
        headers: headers.clone(),
        target,
    };
    if is_sse(&resp) {
        return stream(state, wire, resp, judge, retry, started).await;
    }
    plain(state, wire, resp, judge, &retry, deadline).await
}

/// A whole (non-streamed) response, judged and rewritten; with a second chance when its lone
/// call was a repeat under `chance_then_break`.
async fn plain(
    state: &Shared,
    wire: Wire,
    resp: reqwest::Response,
    mut judge: TurnJudge,
    retry: &Retry,
    deadline: Deadline,
) -> Response {
    let status = resp.status();
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers, judge.secrets());
    let raw = match read_upstream(state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => {
            judging(state, || state.settle_turn(&judge.turn));
            return e.response(wire);
        }
    };
    let (mut value, mut raw, mut done) = match judged(state, wire, raw, &mut judge) {
        Ok(x) => x,
        Err(e) => return e.response(wire),
    };
    let mut rewritten = false;
    if let Some((call, guidance)) = judge.second_chance() {
        // chance_then_break: the repeated call is withheld; the upstream hears that it failed
        // and is asked once more, within this request. Its second answer goes to the client as
        // if it were the first (the same call again is refused by the ladder's next step).
        let again = match retry
            .request()
            .and_then(|request| wire.retry(&request, &value, &call, &guidance))
        {
            Some(body) => second_answer(state, retry, &body, deadline).await,
            None => None,
        };
        match again {
            Some(again_raw) => {
                judge.retrying();
                match judged(state, wire, again_raw, &mut judge) {
                    Ok((mut v, r, d)) => {
                        judge.chance_outcome(if repeated(&d) { "repeated" } else { "changed" });
                        tracing::info!(tool = ?call.name, "a repeated call was withheld and the upstream asked once more");
                        if wire == Wire::Responses {
                            // The client never saw the first answer: the second one is shown
                            // continuing what the client named.
                            crate::wire::responses::show_continuing(
                                &mut v,
                                judge.turn.continues.as_deref(),
                            );
                            rewritten = true;
                        }
                        value = v;
                        raw = r;
                        done = d;
                    }
                    Err(e) => {
                        judge.chance_outcome("repeated");
                        return e.response(wire);
                    }
                }
            }
            None => judge.chance_outcome("failed"),
        }
    }
    let mut out = if done.is_empty() && !rewritten {
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

/// Whether a second answer repeated the call: an intervention on a call that is not a mere
/// warning.
fn repeated(done: &[Intervention]) -> bool {
    done.iter()
        .any(|i| i.tool_call_id.is_some() && i.action != "warn")
}

/// Parses and judges a whole upstream answer: the rewritten body, the upstream's bytes and
/// what the proxy did; or the error to answer with.
fn judged(
    state: &Shared,
    wire: Wire,
    raw: Vec<u8>,
    judge: &mut TurnJudge,
) -> Result<(Value, Vec<u8>, Vec<Intervention>), ApiError> {
    let mut value: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => {
            judging(state, || state.settle_turn(&judge.turn));
            return Err(malformed(state, format!("not JSON: {e}")));
        }
    };
    match judging(state, || wire.rewrite(&mut value, judge)) {
        Rewritten::Judged(done) => Ok((value, raw, done)),
        Rewritten::Stop(e) => Err(e),
        Rewritten::Malformed(what) => {
            judging(state, || state.settle_turn(&judge.turn));
            Err(malformed(state, what))
        }
    }
}

/// The upstream's second answer for a turn whose lone call was a repeat given a second chance.
/// `None` when it cannot be had (the first answer then stands).
async fn second_answer(
    state: &Shared,
    retry: &Retry,
    body: &Value,
    deadline: Deadline,
) -> Option<Vec<u8>> {
    let bytes = serde_json::to_vec(body).ok()?;
    let resp = send(
        state,
        &retry.target,
        &retry.headers,
        Bytes::from(bytes),
        deadline,
    )
    .await
    .ok()?;
    if !resp.status().is_success() {
        state.metrics.upstream_error("status");
        return None;
    }
    read_upstream(state, resp, deadline).await.ok()
}

/// The `x-loopguard-*` headers of a response the proxy changed (the most severe intervention).
fn set_intervention_headers(out: &mut Response, done: &[Intervention]) {
    for (name, value) in crate::judge::headers(done).into_iter().flatten() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            out.headers_mut().insert(name, v);
        }
    }
}

/// Marks a response whose latency the stream's task records when the stream ends.
#[derive(Clone, Copy, Debug)]
struct Pumped;

/// Longest a stream is held back waiting for something the client must see (see [`stream`]).
const HOLD_MAX: Duration = Duration::from_secs(5);

/// What the pump hands the response: bytes of the stream, or (before any byte was sent) the
/// error that stops the session, answered with the same status as a whole request gets.
#[derive(Debug)]
enum Piece {
    Data(Bytes),
    Stop(ApiError),
}

/// What a turn needs to ask the upstream again: the request as it was sent, and the client's
/// headers.
#[derive(Debug)]
struct Retry {
    request: Bytes,
    headers: HeaderMap,
    target: Target,
}

impl Retry {
    /// The request as a value (parsed only when a second chance is given).
    fn request(&self) -> Option<Value> {
        serde_json::from_slice(&self.request).ok()
    }
}

/// A streamed response. Nothing is sent until the stream has something the client must see
/// (text, a released call, a finish), or for at most [`HOLD_MAX`] (half the upstream timeout if
/// shorter): a stop decided before that is a plain error response, the same status and body as
/// without streaming; once bytes have gone out it is the stream's last event. A session whose
/// ladder gives repeated calls a second chance has each turn held whole until judged, so that
/// a retry happens before anything of the turn is sent. What is held is bounded by
/// [`MAX_HELD`]: past it the turn is a 502 `upstream_malformed`, as a whole body that large is.
async fn stream(
    state: &Shared,
    wire: Wire,
    resp: reqwest::Response,
    judge: TurnJudge,
    retry: Retry,
    started: Instant,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Piece>(32);
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers, judge.secrets());
    let session = judge.turn.session.clone();
    tokio::spawn(pump(
        Arc::clone(state),
        wire,
        resp,
        wire.stream(judge),
        retry,
        tx,
        session,
        started,
    ));
    let first = match rx.recv().await {
        Some(Piece::Stop(e)) => {
            let mut out = e.response(wire);
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
            Some(Piece::Stop(e)) => Some(Ok(Bytes::from(e.sse_event(wire)))),
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

/// How a pumped stream ended.
enum Ended {
    /// The stream is over (or the client went away: `gone`).
    Done { gone: bool },
    /// The turn was held whole and its lone call is to get a second chance.
    Retry,
    /// What was held back grew past [`MAX_HELD`]: the turn was answered with an error.
    TooLarge,
}

/// The events of a turn held back before anything of it is sent, and what they cost.
#[derive(Debug, Default)]
struct Held {
    events: Vec<String>,
    bytes: usize,
}

impl Held {
    /// Holds `events`; false (and nothing more held) once the total would pass `cap`.
    fn hold(&mut self, events: Vec<String>, cap: usize) -> bool {
        for e in events {
            self.bytes = self
                .bytes
                .saturating_add(e.len())
                .saturating_add(std::mem::size_of::<String>());
            if self.bytes > cap {
                return false;
            }
            self.events.push(e);
        }
        true
    }

    /// The events held, taken out.
    fn take(&mut self) -> Vec<String> {
        self.bytes = 0;
        std::mem::take(&mut self.events)
    }
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    state: Shared,
    wire: Wire,
    resp: reqwest::Response,
    rw: Box<dyn Rewriter<TurnJudge>>,
    retry: Retry,
    tx: mpsc::Sender<Piece>,
    session: String,
    started: Instant,
) {
    let mut rw = rw;
    let mut resp = resp;
    let mut held = Held::default();
    let mut open = false;
    let hold_whole = rw.judge().turn.second_chances;
    let mut retried = false;
    loop {
        let ended = pump_one(
            &state, &mut resp, &mut rw, &tx, &mut held, &mut open, hold_whole,
        )
        .await;
        match ended {
            Ended::Done { gone } => {
                if retried {
                    let outcome = if repeated(&rw.state().interventions) {
                        "repeated"
                    } else {
                        "changed"
                    };
                    rw.judge().chance_outcome(outcome);
                }
                finish(&state, &mut rw, gone, &session, started);
                return;
            }
            Ended::Retry => {}
            Ended::TooLarge => {
                if retried {
                    rw.judge().chance_outcome("failed");
                }
                judging(&state, || state.settle_turn(&rw.judge().turn));
                finish(&state, &mut rw, false, &session, started);
                return;
            }
        }
        // A second chance: the held turn is dropped and the upstream asked once more; its
        // stream is pumped in its place as if it were the first.
        let Some((call, guidance)) = rw.judge().second_chance() else {
            return;
        };
        let again = match (rw.answer(), retry.request()) {
            (Some(answer), Some(request)) => wire.retry(&request, &answer, &call, &guidance),
            _ => None,
        };
        let deadline = Deadline::now() + state.options.timeout;
        let next = match again {
            Some(body) => match serde_json::to_vec(&body) {
                Ok(bytes) => send(
                    &state,
                    &retry.target,
                    &retry.headers,
                    Bytes::from(bytes),
                    deadline,
                )
                .await
                .ok(),
                Err(_) => None,
            },
            None => None,
        };
        match next {
            Some(r) if r.status().is_success() && is_sse(&r) => {
                let mut judge = rw.into_judge();
                judge.retrying();
                tracing::info!(tool = ?call.name, "a repeated call was withheld and the upstream asked once more");
                let continues = judge.turn.continues.clone();
                rw = wire.stream(judge);
                rw.continues(continues.as_deref());
                resp = r;
                held.take();
                retried = true;
            }
            _ => {
                // The first answer stands, warned.
                rw.judge().chance_outcome("failed");
                if let Some(r) = next
                    && !r.status().is_success()
                {
                    state.metrics.upstream_error("status");
                }
                let mut gone = false;
                for e in held.take() {
                    if tx.send(Piece::Data(Bytes::from(e))).await.is_err() {
                        gone = true;
                        break;
                    }
                }
                finish(&state, &mut rw, gone, &session, started);
                return;
            }
        }
    }
}

/// Pumps one upstream stream through its rewriter to the client.
async fn pump_one(
    state: &Shared,
    resp: &mut reqwest::Response,
    rw: &mut Box<dyn Rewriter<TurnJudge>>,
    tx: &mpsc::Sender<Piece>,
    held: &mut Held,
    open: &mut bool,
    hold_whole: bool,
) -> Ended {
    let idle = state.options.timeout;
    let secs = idle.as_secs_f64();
    let wire = rw.judge().turn.wire;
    let hold_until = tokio::time::Instant::now() + HOLD_MAX.min(idle / 2);
    loop {
        let next = tokio::select! {
            () = tx.closed() => return Ended::Done { gone: true },
            () = tokio::time::sleep_until(hold_until), if !*open && !hold_whole => {
                // Held long enough: the stream opens (a comment if there is nothing yet, so
                // that the client gets its headers); a later stop is its last event.
                *open = true;
                let mut ready = held.take();
                if ready.is_empty() {
                    ready.push(": loopguard\n\n".to_owned());
                }
                for e in ready {
                    if tx.send(Piece::Data(Bytes::from(e))).await.is_err() {
                        return Ended::Done { gone: true };
                    }
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
                (vec![e.sse_event(wire)], true)
            }
            Ok(Err(e)) => {
                state.metrics.upstream_error("interrupted");
                let e = ApiError::upstream(
                    StatusCode::BAD_GATEWAY,
                    "upstream_interrupted",
                    format!("the upstream stream broke off: {e}"),
                );
                (vec![e.sse_event(wire)], true)
            }
            Ok(Ok(None)) => (judging(state, || rw.finish()), true),
            Ok(Ok(Some(bytes))) => (judging(state, || rw.push(&bytes)), false),
        };
        let closed = rw.state().closed;
        let ready = if *open {
            events
        } else if let Some(e) = rw.state().terminated.clone() {
            // Stopped before anything was sent: a plain error response.
            if tx.send(Piece::Stop(e)).await.is_err() {
                return Ended::Done { gone: true };
            }
            return Ended::Done { gone: false };
        } else {
            if !held.hold(events, MAX_HELD) {
                // Nothing was sent yet: the turn is answered as a whole body this large is.
                held.take();
                let e = malformed(
                    state,
                    format!("a streamed turn held back is larger than {MAX_HELD} bytes"),
                );
                if tx.send(Piece::Stop(e)).await.is_err() {
                    return Ended::Done { gone: true };
                }
                return Ended::TooLarge;
            }
            if hold_whole {
                if !(last || closed) {
                    continue;
                }
                if rw.judge().chance.is_some() && !rw.judge().retried {
                    return Ended::Retry;
                }
            } else if !(rw.state().committed || last || closed) {
                continue;
            }
            *open = true;
            held.take()
        };
        for e in ready {
            if tx.send(Piece::Data(Bytes::from(e))).await.is_err() {
                return Ended::Done { gone: true };
            }
        }
        if last || closed {
            return Ended::Done { gone: false };
        }
    }
}

/// Counts how a stream ended.
fn finish(
    state: &State,
    rw: &mut Box<dyn Rewriter<TurnJudge>>,
    gone: bool,
    session: &str,
    started: Instant,
) {
    let s = rw.state();
    if s.malformed {
        state.metrics.upstream_error("malformed");
    }
    if s.upstream_error {
        state.metrics.upstream_error("status");
    }
    if gone {
        state.metrics.client_disconnect();
        tracing::info!(
            session = ?session,
            unreleased_calls = rw.abandon(),
            "the client went away mid-stream; the upstream request is dropped"
        );
        judging(state, || state.settle_turn(&rw.judge().turn));
    }
    state.metrics.observe_latency(started.elapsed());
}

/// The proxy's own answer (to in-chat commands), shaped as the client asked.
/// `array`: the client asked for Gemini's JSON array of responses (`streamGenerateContent`
/// without `alt=sse`), which gets the answer as an array of one.
fn reply(state: &State, turn: &Turn, text: &str, array: bool) -> Response {
    let model = turn.model.as_deref().unwrap_or("loopguard");
    let (mut body, content_type) = turn.wire.reply(text, model, state.next_id(), turn.stream);
    if array {
        body = format!("[{body}]");
    }
    let mut out = Response::new(Body::from(body));
    out.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    out
}

/// Passes a request of a route beside the model endpoints (the model list, Anthropic's token
/// count, stored Responses) to the upstream, unjudged: its path segment by segment under the
/// upstream's base, its body bounded.
async fn passthrough(
    Extract(state): Extract<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = uri.path();
    // Gemini's paths go to the upstream whole (its base has no version); others' lose the
    // `/v1` their base already ends with.
    let google = path.starts_with("/v1beta/")
        || path == "/v1beta/models"
        || headers.contains_key("x-goog-api-key")
        || query_pairs(uri.query()).iter().any(|(k, _)| k == "key");
    let rest = if google {
        path
    } else {
        path.strip_prefix("/v1").unwrap_or(path)
    };
    let ident = with_query_key(&headers, uri.query());
    let route = if rest.starts_with("/models") || (google && rest.contains("/models")) {
        "models"
    } else {
        "passthrough"
    };
    state.metrics.request(route);
    // A refusal is shaped for the API the route belongs to: the token count is Anthropic's,
    // stored responses are OpenAI's, and the model list is either (Anthropic clients send
    // `anthropic-version` with every request).
    let wire = if google {
        Wire::Gemini
    } else if rest.starts_with("/messages/") || headers.contains_key("anthropic-version") {
        Wire::Messages
    } else if rest.starts_with("/responses/") {
        Wire::Responses
    } else {
        Wire::Chat
    };
    if let Some(refused) = keyless(&state, &ident, wire, route) {
        return refused;
    }
    let Some(segments) = rest
        .strip_prefix('/')
        .and_then(crate::upstream::model_segments)
    else {
        let e = ApiError::invalid_request(
            "invalid_path",
            "a path may not have empty, `.` or `..` segments",
        );
        return refused(&state, route, e).response(wire);
    };
    let bytes = if method == Method::GET || method == Method::HEAD {
        Bytes::new()
    } else {
        match read_body(
            &headers,
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
                return refused(&state, route, e).response(wire);
            }
        }
    };
    let url = state
        .upstream
        .endpoint(segments.iter().map(String::as_str), uri.query());
    let deadline = Deadline::now() + state.options.timeout;
    let mut request = state
        .client
        .request(method.clone(), url)
        .headers(forwarded(&headers));
    if !bytes.is_empty() {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
    }
    let resp = match timeout_at(deadline, request.send()).await {
        Err(_) => return timed_out(&state, "with response headers").response(wire),
        Ok(Err(e)) => return upstream_failure(&state, &e, "with response headers").response(wire),
        Ok(Ok(r)) => r,
    };
    let secrets = Secrets::of(&ident, &state.upstream);
    if !resp.status().is_success() {
        return pass_error(&state, wire, resp, deadline, &secrets).await;
    }
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
    let mut headers = HeaderMap::new();
    passed_back(resp.headers(), &mut headers, &secrets);
    let body = match read_upstream(&state, resp, deadline).await {
        Ok(b) => b,
        Err(e) => return e.response(wire),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_turn_is_bounded_by_its_bytes_and_its_events() {
        let per = std::mem::size_of::<String>();
        let cap = 3 * (2 + per);
        let mut held = Held::default();
        assert!(held.hold(vec!["ab".to_owned(); 3], cap));
        assert!(!held.hold(vec![String::new()], cap), "one more is too many");
        assert_eq!(held.take().len(), 3);
        assert!(
            held.hold(vec!["ab".to_owned(); 3], cap),
            "taken: counted anew"
        );
        // Empty events cost their strings: a stream of them is bounded too.
        let mut held = Held::default();
        assert!(!held.hold(vec![String::new(); 1000], 100 * per));
        assert_eq!(held.events.len(), 100);
    }

    // Regression: upstream response headers were passed back without redaction, so a header
    // quoting the caller's key showed it to the client.
    #[test]
    fn passed_back_headers_hold_no_credential_and_nothing_hop_by_hop() {
        let key = "sk-proj-Zx81Qm0Ppd4rLkV2aT9s";
        let secrets = Secrets::new([key.to_owned()]);
        let mut from = HeaderMap::new();
        for (name, value) in [
            ("x-request-id", format!("req-{key}")),
            ("openai-debug-auth", format!("Bearer {key}")),
            ("x-ratelimit-limit-requests", "60".to_owned()),
            ("retry-after", "sk-proj-Zx81Qm0Ppd4rLkV2aT9%73".to_owned()),
            (
                "www-authenticate",
                format!("Bearer error_description=\"{key}\""),
            ),
            ("set-cookie", format!("k={key}")),
            ("x-debug-auth", format!("Bearer {key}")),
            ("content-length", "12".to_owned()),
            ("transfer-encoding", "chunked".to_owned()),
            ("connection", "keep-alive, openai-hop".to_owned()),
            ("keep-alive", "timeout=5".to_owned()),
            ("openai-hop", "1".to_owned()),
            (
                &format!("openai-{}", key.to_ascii_lowercase())[..],
                "1".to_owned(),
            ),
        ] {
            from.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(&value).unwrap(),
            );
        }
        let mut to = HeaderMap::new();
        passed_back(&from, &mut to, &secrets);
        let mut names: Vec<&str> = to.keys().map(axum::http::HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "openai-debug-auth",
                "retry-after",
                "x-ratelimit-limit-requests",
                "x-request-id"
            ]
        );
        assert_eq!(to["x-request-id"], "req-[redacted]");
        assert_eq!(to["openai-debug-auth"], "Bearer [redacted]");
        assert_eq!(to["retry-after"], "[redacted]");
        assert_eq!(to["x-ratelimit-limit-requests"], "60");
    }
}
