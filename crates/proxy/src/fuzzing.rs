//! The proxy's parsers as plain functions, for the fuzz tests (`tests/tests/fuzz.rs`): a
//! chat-completions request body, an upstream's JSON answer and an upstream's SSE stream, each
//! run through the same code as a served request, in process and with no network.

use std::sync::{Arc, OnceLock};

use axum::http::{HeaderMap, HeaderValue};
use loopguard_rules::{Policy, Settings};
use serde_json::Value;

use crate::judge::rewrite_response;
use crate::state::{Prepared, State, TurnJudge};
use crate::stream::StreamJudge;
use crate::upstream::Upstream;
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

/// A request body as `POST /v1/chat/completions` reads it: parsed, its session found, its
/// commands and tail events judged, its body rewritten for the upstream.
pub fn request(body: &[u8]) {
    let Ok(mut json @ Value::Object(_)) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let Some(state) = state() else { return };
    if let Prepared::Forward(_) = state.prepare(&headers(), &mut json) {
        let _ = serde_json::to_vec(&json);
    }
}

/// A session's turn with the upstream's answer `body`: judged and rewritten as a plain JSON
/// response would be.
pub fn response(body: &[u8]) {
    let Some(judge) = turn() else { return };
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let mut judge = judge;
    let _ = rewrite_response(&mut value, &mut judge);
}

/// A session's turn with the upstream's SSE stream `bytes`, fed in pieces of `step` bytes.
pub fn stream(bytes: &[u8], step: usize) {
    let Some(judge) = turn() else { return };
    let mut s = StreamJudge::new(judge);
    for piece in bytes.chunks(step.max(1)) {
        let _ = s.push(piece);
    }
    let _ = s.finish();
}

/// A turn of a fixed conversation, ready to judge the model's answer.
fn turn() -> Option<TurnJudge> {
    let mut json = serde_json::json!({
        "model": "fuzz",
        "messages": [{"role": "user", "content": "run the tests"}],
    });
    let state = state()?;
    match state.prepare(&headers(), &mut json) {
        Prepared::Forward(turn) => Some(TurnJudge::new(Arc::clone(state), turn)),
        _ => None,
    }
}
