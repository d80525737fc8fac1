//! The scripted upstream's OpenAI Responses route (`POST /v1/responses`): the shapes and the
//! event sequence of the real API, stored responses continued with `previous_response_id`,
//! and the checks the real API makes on a request.

use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::{
    Fake, Received, Scripted, TOLD, json_body, named_event, pieces, script, sse_body, thirds,
};

/// The `call_id` of the call a turn of request `n` makes.
pub fn call_id(n: u64) -> String {
    format!("call_{n}")
}

/// The id of the response to request `n`.
pub fn response_id(n: u64) -> String {
    format!("resp_{n}")
}

fn message_item(n: u64, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{n}"), "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(n: u64, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": call_id(n),
        "name": name, "arguments": arguments, "status": status})
}

/// The output items of a turn.
fn output(n: u64, turn: &Scripted) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(t) = turn.text {
        out.push(message_item(n, t, "completed"));
    }
    for (name, args) in &turn.calls {
        out.push(call_item(n, name, args, "completed"));
    }
    out
}

/// The response object, as the real API answers (`status` and `output` as given).
fn response(request: &Value, n: u64, status: &str, output: Vec<Value>) -> Value {
    json!({
        "id": response_id(n), "object": "response", "created_at": 1_700_000_000, "status": status,
        "error": null, "incomplete_details": null, "instructions": request["instructions"],
        "model": request["model"], "output": output, "parallel_tool_calls": true,
        "previous_response_id": request["previous_response_id"],
        "store": request["store"] != json!(false), "temperature": 1.0,
        "tool_choice": "auto", "tools": request.get("tools").cloned().unwrap_or(json!([])),
        "top_p": 1.0, "truncation": "disabled",
        "usage": {"input_tokens": 12, "output_tokens": 6, "total_tokens": 18},
    })
}

/// A whole response (`POST /v1/responses` without `stream`).
pub fn whole(request: &Value, n: u64, turn: &Scripted) -> Value {
    response(request, n, "completed", output(n, turn))
}

/// The same turn as the real API streams it, every event with its `sequence_number`:
/// `response.created`, `response.in_progress`; for text, `response.output_item.added`,
/// `response.content_part.added`, several `response.output_text.delta`s,
/// `response.output_text.done`, `response.content_part.done`, `response.output_item.done`;
/// for a call, `response.output_item.added`, `response.function_call_arguments.delta`
/// fragments, `response.function_call_arguments.done`, `response.output_item.done`; then
/// `response.completed`.
pub fn events(request: &Value, n: u64, turn: &Scripted) -> Vec<String> {
    let mut data = vec![
        json!({"type": "response.created", "response": response(request, n, "in_progress", vec![])}),
        json!({"type": "response.in_progress", "response": response(request, n, "in_progress", vec![])}),
    ];
    let mut index = 0;
    if let Some(t) = turn.text {
        let id = format!("msg_{n}");
        let mut added = message_item(n, t, "in_progress");
        added["content"] = json!([]);
        data.push(
            json!({"type": "response.output_item.added", "output_index": index, "item": added}),
        );
        data.push(json!({"type": "response.content_part.added", "item_id": id,
            "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}));
        for piece in thirds(t) {
            data.push(json!({"type": "response.output_text.delta", "item_id": id,
                "output_index": index, "content_index": 0, "delta": piece, "logprobs": []}));
        }
        data.push(json!({"type": "response.output_text.done", "item_id": id,
            "output_index": index, "content_index": 0, "text": t, "logprobs": []}));
        data.push(json!({"type": "response.content_part.done", "item_id": id,
            "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": t, "annotations": []}}));
        data.push(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": message_item(n, t, "completed")}),
        );
        index += 1;
    }
    for (name, args) in &turn.calls {
        let id = format!("fc_{n}");
        data.push(
            json!({"type": "response.output_item.added", "output_index": index,
            "item": call_item(n, name, "", "in_progress")}),
        );
        for piece in pieces(args, 5) {
            data.push(
                json!({"type": "response.function_call_arguments.delta", "item_id": id,
                "output_index": index, "delta": piece}),
            );
        }
        data.push(
            json!({"type": "response.function_call_arguments.done", "item_id": id,
            "output_index": index, "arguments": args}),
        );
        data.push(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": call_item(n, name, args, "completed")}),
        );
        index += 1;
    }
    data.push(json!({"type": "response.completed", "response": whole(request, n, turn)}));
    data.into_iter()
        .enumerate()
        .map(|(seq, mut d)| {
            d["sequence_number"] = json!(seq);
            named_event(&d)
        })
        .collect()
}

/// OpenAI's error envelope for a 400 about `param`.
pub fn invalid(message: &str, param: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": param,
        "code": null}})
}

/// What the real API refuses that a proxy could get wrong: `previous_response_id` naming no
/// stored response, and a call left without its output — every call of the continued
/// response and every `function_call` item of `input` must be answered by a
/// `function_call_output` in `input`.
fn check(f: &Fake, body: &Value) -> Option<Value> {
    let input = match &body["input"] {
        Value::String(s) => vec![json!({"role": "user", "content": s})],
        Value::Array(items) => items.clone(),
        _ => return Some(invalid("Missing required parameter: 'input'.", "input")),
    };
    let mut owed: Vec<String> = Vec::new();
    if let Some(prev) = body["previous_response_id"].as_str() {
        match f.stored.lock().unwrap().get(prev) {
            Some(calls) => owed.extend(calls.iter().cloned()),
            None => {
                return Some(invalid(
                    &format!("Previous response with id '{prev}' not found."),
                    "previous_response_id",
                ));
            }
        }
    }
    let ids = |ty: &str| -> Vec<String> {
        input
            .iter()
            .filter(|i| i["type"] == ty)
            .filter_map(|i| i["call_id"].as_str().map(str::to_owned))
            .collect()
    };
    owed.extend(ids("function_call"));
    let answered = ids("function_call_output");
    owed.into_iter()
        .find(|id| !answered.contains(id))
        .map(|id| {
            invalid(
                &format!("No tool output found for function call {id}."),
                "input",
            )
        })
}

/// Whether the request's `input` ends with a `function_call_output` whose output carries the
/// second chance's guidance ([`TOLD`]).
fn told(body: &Value) -> bool {
    let last = body["input"].as_array().and_then(|i| i.last());
    last.is_some_and(|i| {
        let output = match &i["output"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        i["type"] == "function_call_output" && output.contains(TOLD)
    })
}

/// `POST /v1/responses`: the model's turn for the request's `model` ([`script`]), whole or
/// streamed as asked, with the id `resp_N`; stored (unless `store: false`) with the calls it
/// made, so that a request continuing it is checked ([`check`]: a 400 like the real API's).
/// Every request is recorded with its headers.
pub async fn fake_responses(State(f): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    let n = f.n.fetch_add(1, Ordering::SeqCst) + 1;
    let model = v["model"].as_str().unwrap_or_default().to_owned();
    let record = |status: StatusCode, answer: Option<Value>| {
        f.received.lock().unwrap().push(Received {
            route: "responses",
            headers: headers.clone(),
            body: v.clone(),
            status: status.as_u16(),
            answer,
        });
    };
    if let Some(e) = check(&f, &v) {
        record(StatusCode::BAD_REQUEST, Some(e.clone()));
        return json_body(StatusCode::BAD_REQUEST, &e);
    }
    let Some(turn) = script(&model, n, told(&v)) else {
        let e = invalid(&format!("The model `{model}` does not exist."), "model");
        record(StatusCode::NOT_FOUND, Some(e.clone()));
        return json_body(StatusCode::NOT_FOUND, &e);
    };
    if v["store"] != json!(false) {
        let calls = turn.calls.iter().map(|_| call_id(n)).collect();
        f.stored.lock().unwrap().insert(response_id(n), calls);
    }
    if v["stream"] == json!(true) {
        record(StatusCode::OK, None);
        sse_body(events(&v, n, &turn), std::time::Duration::from_millis(1))
    } else {
        let answer = whole(&v, n, &turn);
        record(StatusCode::OK, Some(answer.clone()));
        json_body(StatusCode::OK, &answer)
    }
}
