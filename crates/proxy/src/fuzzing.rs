//! The proxy's parsers as plain functions, for the fuzz tests (`tests/tests/fuzz.rs`) and the
//! profile driver `benches/examples/proxy_turn.rs`: a request body, an upstream's whole answer
//! and an upstream's stream, of any wire format, and a whole turn, each run through the same
//! code as a served request, in process and with no network.

use std::sync::{Arc, OnceLock};

use axum::http::{HeaderMap, HeaderValue};
use loopguard_rules::{Policy, Settings};
use serde_json::Value;

use crate::state::{Prepared, State, TurnJudge};
use crate::upstream::Upstream;
use crate::wire::Wire;
use crate::{ChatCommands, Options, Setup};

/// One proxy state for every fuzz input of a process (sessions accumulate, as in a server);
/// `None` only if the built-in policy were invalid, which its own tests rule out.
fn state() -> Option<&'static Arc<State>> {
    static STATE: OnceLock<Option<Arc<State>>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let policy = Policy::builtin_default().policy?;
            let options = Options {
                chat_commands: ChatCommands::Everyone,
                max_sessions: 1000,
                ..Options::new("http://127.0.0.1:9/v1")
            };
            let upstream = Upstream::parse(&options.upstream).ok()?;
            Some(Arc::new(State::new(
                options,
                upstream,
                None,
                reqwest::Client::new(),
                Setup {
                    policy,
                    server: Settings::default(),
                },
                None,
            )))
        })
        .as_ref()
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("authorization", HeaderValue::from_static("Bearer sk-fuzz"));
    h
}

/// A request body as the route of `wire` reads it: parsed, its session found, its commands and
/// tail events judged, its body rewritten for the upstream.
pub fn request(wire: Wire, body: &[u8]) {
    let Ok(mut body) = wire.body(body) else {
        return;
    };
    let Some(state) = state() else { return };
    if let Prepared::Forward(_) = state.prepare(wire, &headers(), &mut body) {
        let out = body.to_bytes();
        // What goes upstream is JSON whenever the proxy wrote it: checked by syntax, since a
        // client's number may lie beyond what a `Value` holds (`1e999`) and is passed as sent.
        let parsed = serde_json::from_slice::<serde::de::IgnoredAny>(&out);
        debug_assert!(parsed.is_ok(), "{}", String::from_utf8_lossy(&out));
    }
}

/// One whole turn as a served request has it: the request `body` read and judged, then the
/// upstream's answer to it judged and rewritten: a JSON body (the pieces of `answer` joined),
/// or, when `streamed`, SSE bytes fed piece by piece. Returns the bytes the client would get
/// (the answer's own when nothing changed it), or nothing when the request was not forwarded.
pub fn exchange(wire: Wire, body: &[u8], answer: &[Vec<u8>], streamed: bool) -> Vec<u8> {
    let Ok(mut request) = wire.body(body) else {
        return Vec::new();
    };
    let Some(state) = state() else {
        return Vec::new();
    };
    let Prepared::Forward(turn) = state.prepare(wire, &headers(), &mut request) else {
        return Vec::new();
    };
    let mut judge = TurnJudge::new(Arc::clone(state), *turn);
    if streamed {
        let mut s = wire.stream(judge);
        let mut out = Vec::new();
        for piece in answer {
            for e in s.push(piece) {
                out.extend_from_slice(e.as_bytes());
            }
        }
        for e in s.finish() {
            out.extend_from_slice(e.as_bytes());
        }
        return out;
    }
    let answer = answer.concat();
    let Ok(mut value) = serde_json::from_slice::<Value>(&answer) else {
        return Vec::new();
    };
    match wire.rewrite(&mut value, &mut judge) {
        crate::wire::Rewritten::Judged(done) if done.is_empty() => answer,
        _ => serde_json::to_vec(&value).unwrap_or_default(),
    }
}

/// A session's turn with the upstream's whole answer `body`: judged and rewritten.
pub fn response(wire: Wire, body: &[u8]) {
    let Some(mut judge) = turn(wire) else { return };
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let _ = wire.rewrite(&mut value, &mut judge);
}

/// A session's turn with the upstream's stream `bytes`, fed in pieces of `step` bytes.
pub fn stream(wire: Wire, bytes: &[u8], step: usize) {
    let Some(judge) = turn(wire) else { return };
    let mut s = wire.stream(judge);
    for piece in bytes.chunks(step.max(1)) {
        let _ = s.push(piece);
    }
    let _ = s.finish();
    let _ = s.answer();
}

/// A turn of a fixed conversation, ready to judge the model's answer.
fn turn(wire: Wire) -> Option<TurnJudge> {
    let json = match wire {
        Wire::Responses => serde_json::json!({"model": "fuzz", "input": "run the tests"}),
        Wire::Gemini => serde_json::json!({
            "contents": [{"role": "user", "parts": [{"text": "run the tests"}]}],
        }),
        _ => serde_json::json!({
            "model": "fuzz",
            "messages": [{"role": "user", "content": "run the tests"}],
        }),
    };
    let mut body = crate::body::Body::from_value(&json, wire.list_key())?;
    let state = state()?;
    match state.prepare(wire, &headers(), &mut body) {
        Prepared::Forward(turn) => Some(TurnJudge::new(Arc::clone(state), *turn)),
        _ => None,
    }
}
