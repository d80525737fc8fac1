//! The scripted upstream's Anthropic Messages route (`POST /v1/messages`): the shapes and the
//! event sequence of the real API, and the checks it makes on a request.

use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::{
    Fake, Received, Scripted, TOLD, json_body, named_event, pieces, script, sse_body, thirds,
};

/// The id of the `tool_use` block a turn of request `n` calls with.
pub fn tool_use_id(n: u64) -> String {
    format!("toolu_{n}")
}

/// A whole message (`POST /v1/messages` without `stream`), as the real API answers.
pub fn message(model: &str, n: u64, turn: &Scripted) -> Value {
    let mut content = Vec::new();
    if let Some(t) = turn.text {
        content.push(json!({"type": "text", "text": t}));
    }
    for (name, args) in &turn.calls {
        let input: Value = serde_json::from_str(args).unwrap();
        content
            .push(json!({"type": "tool_use", "id": tool_use_id(n), "name": name, "input": input}));
    }
    let stop = if turn.calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    json!({
        "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 6}
    })
}

/// The same turn as the real API streams it: `message_start`, a `ping`, the text block in
/// several `text_delta`s, each `tool_use` block with its input in `input_json_delta` fragments
/// (the first one empty, as the API sends it), `message_delta` with the stop reason and
/// `message_stop`.
pub fn events(model: &str, n: u64, turn: &Scripted) -> Vec<String> {
    let whole = message(model, n, turn);
    let mut start = whole.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"] = json!({"input_tokens": 12, "output_tokens": 1});
    let mut out = vec![
        named_event(&json!({"type": "message_start", "message": start})),
        named_event(&json!({"type": "ping"})),
    ];
    let mut index = 0;
    if let Some(t) = turn.text {
        out.push(named_event(
            &json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in thirds(t) {
            out.push(named_event(
                &json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        out.push(named_event(
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for (name, args) in &turn.calls {
        out.push(named_event(&json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": tool_use_id(n), "name": name, "input": {}}})));
        for piece in std::iter::once("").chain(pieces(args, 5)) {
            out.push(named_event(
                &json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        out.push(named_event(
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    out.push(named_event(&json!({"type": "message_delta",
        "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": 6}})));
    out.push(named_event(&json!({"type": "message_stop"})));
    out
}

/// Anthropic's error envelope.
pub fn error(status: StatusCode, kind: &str, message: &str) -> (StatusCode, Value) {
    (
        status,
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// What the real API refuses that a proxy could get wrong: a missing `max_tokens` or
/// `messages`, and a `tool_use` block not answered by a `tool_result` in the next message.
fn check(body: &Value) -> Option<(StatusCode, Value)> {
    let invalid = |m: String| error(StatusCode::BAD_REQUEST, "invalid_request_error", &m);
    if !body["max_tokens"].is_u64() {
        return Some(invalid("max_tokens: Field required".to_owned()));
    }
    let Some(messages) = body["messages"].as_array() else {
        return Some(invalid("messages: Field required".to_owned()));
    };
    for (i, m) in messages.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
        let answered: Vec<Value> = messages
            .get(i + 1)
            .filter(|next| next["role"] == "user")
            .map(|next| {
                blocks(next)
                    .iter()
                    .filter(|b| b["type"] == "tool_result")
                    .map(|b| b["tool_use_id"].clone())
                    .collect()
            })
            .unwrap_or_default();
        let unanswered: Vec<String> = blocks(m)
            .iter()
            .filter(|b| b["type"] == "tool_use" && !answered.contains(&b["id"]))
            .map(|b| b["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        if !unanswered.is_empty() {
            return Some(invalid(format!(
                "messages.{}: `tool_use` ids were found without `tool_result` blocks \
                 immediately after: {}. Each `tool_use` block must have a corresponding \
                 `tool_result` block in the next message.",
                i + 1,
                unanswered.join(", ")
            )));
        }
    }
    None
}

/// Whether the request ends with a failed `tool_result` whose text carries the second chance's
/// guidance ([`TOLD`]).
fn told(body: &Value) -> bool {
    let last = body["messages"].as_array().and_then(|m| m.last());
    let Some(last) = last.filter(|m| m["role"] == "user") else {
        return false;
    };
    last["content"].as_array().into_iter().flatten().any(|b| {
        let text = match &b["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        b["type"] == "tool_result" && b["is_error"] == json!(true) && text.contains(TOLD)
    })
}

/// `POST /v1/messages`: the model's turn for the request's `model` ([`script`]), whole or
/// streamed as asked; a 400 with Anthropic's error envelope for a request the real API would
/// refuse ([`check`]). Every request is recorded with its headers.
pub async fn fake_messages(State(f): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    let n = f.n.fetch_add(1, Ordering::SeqCst) + 1;
    let model = v["model"].as_str().unwrap_or_default().to_owned();
    let record = |status: StatusCode, answer: Option<Value>| {
        f.received.lock().unwrap().push(Received {
            route: "messages",
            headers: headers.clone(),
            body: v.clone(),
            status: status.as_u16(),
            answer,
        });
    };
    if let Some((status, e)) = check(&v) {
        record(status, Some(e.clone()));
        return json_body(status, &e);
    }
    let Some(turn) = script(&model, n, told(&v)) else {
        let (status, e) = error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("model: {model}"),
        );
        record(status, Some(e.clone()));
        return json_body(status, &e);
    };
    if v["stream"] == json!(true) {
        record(StatusCode::OK, None);
        sse_body(
            events(&model, n, &turn),
            std::time::Duration::from_millis(1),
        )
    } else {
        let answer = message(&model, n, &turn);
        record(StatusCode::OK, Some(answer.clone()));
        json_body(StatusCode::OK, &answer)
    }
}
