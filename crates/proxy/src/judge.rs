//! Judging an assistant turn and rewriting a whole (non-streaming) response.
//!
//! The judging itself (engine, session book, metrics) sits behind the [`Judge`] trait, so the
//! response rewriting here and in [`crate::stream`] is tested without a server.

use axum::http::StatusCode;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::request::{append_text, text_of};

/// One tool call of an assistant turn, assembled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallIn {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (a JSON text, normally).
    pub arguments: String,
}

/// What to do with an assistant turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    /// Indices of the calls released to the client, in order.
    pub released: Vec<usize>,
    /// What the proxy did in this turn (warned, refused, asked), for the client to see.
    pub interventions: Vec<Intervention>,
    /// Calls were withheld and none released: the turn ends here (`finish_reason: "stop"`),
    /// and `note` is appended to the assistant's content.
    pub stop: bool,
    pub note: Option<String>,
    /// The session is stopped: answer with this error instead.
    pub terminate: Option<ApiError>,
}

impl Judged {
    /// Everything released, nothing to add.
    pub fn allow_all(n: usize) -> Judged {
        Judged {
            released: (0..n).collect(),
            ..Judged::default()
        }
    }
}

/// One intervention, as clients see it: in the `x-loopguard-*` headers and the `loopguard` body
/// field of the response it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Intervention {
    /// `warn`, `block`, `ask` or `terminate`.
    pub action: &'static str,
    pub detector: String,
    pub rule: String,
    pub count: u32,
    /// The call it is about (`None` for text loops).
    pub tool_call_id: Option<String>,
}

impl Intervention {
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "action": self.action,
            "detector": self.detector,
            "rule": self.rule,
            "count": self.count,
            "tool_call_id": self.tool_call_id,
        })
    }
}

/// The `loopguard` body field of a response carrying `interventions`.
pub fn body_field(interventions: &[Intervention]) -> Value {
    serde_json::json!({
        "interventions": interventions.iter().map(Intervention::to_json).collect::<Vec<_>>(),
    })
}

/// The header values for `interventions`: the most severe one's action, detector and rule.
pub fn headers(interventions: &[Intervention]) -> Option<[(&'static str, String); 3]> {
    let rank = |a: &str| match a {
        "warn" => 1,
        "ask" => 2,
        "block" => 3,
        "terminate" => 4,
        _ => 0,
    };
    let top = interventions.iter().max_by_key(|i| rank(i.action))?;
    Some([
        (ACTION_HEADER, top.action.to_owned()),
        ("x-loopguard-detector", top.detector.clone()),
        ("x-loopguard-rule", top.rule.clone()),
    ])
}

/// The header that says what the proxy did to a response.
pub const ACTION_HEADER: &str = "x-loopguard-action";

/// Judges the turns of one response, in order.
pub trait Judge {
    /// `text` is the turn's assistant text, `calls` its tool calls in order.
    fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged;
}

/// Reads a tool call object (`{"id", "type", "function": {"name", "arguments"}}`).
pub fn call_of(v: &Value) -> CallIn {
    let f = v.get("function");
    CallIn {
        id: v
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        name: f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        arguments: arguments_text(f.and_then(|f| f.get("arguments"))),
    }
}

fn arguments_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

fn malformed(what: &str) -> ApiError {
    ApiError::upstream(
        StatusCode::BAD_GATEWAY,
        "upstream_malformed",
        format!("the upstream answered with a malformed chat completion: {what}"),
    )
}

/// Judges every choice of a chat completion and rewrites it: withheld calls leave
/// `tool_calls`; a turn left with none gets the note in its content and `finish_reason: "stop"`.
/// A terminate verdict is returned as the error to answer with.
/// Judges and rewrites a plain (non-streamed) response; returns what the proxy did.
pub fn rewrite_response(
    body: &mut Value,
    judge: &mut dyn Judge,
) -> Result<Vec<Intervention>, ApiError> {
    let mut done = Vec::new();
    let Some(obj) = body.as_object_mut() else {
        return Err(malformed("the body is not a JSON object"));
    };
    let choices = match obj.get_mut("choices") {
        Some(Value::Array(c)) => c,
        None | Some(Value::Null) => return Ok(done),
        Some(_) => return Err(malformed("`choices` is not an array")),
    };
    for choice in choices.iter_mut() {
        let Some(Value::Object(msg)) = choice.get_mut("message") else {
            continue;
        };
        let text = text_of(msg.get("content"));
        let mut calls: Vec<CallIn> = match msg.get("tool_calls") {
            Some(Value::Array(tc)) => tc.iter().map(call_of).collect(),
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(malformed("`tool_calls` is not an array")),
        };
        let n_tools = calls.len();
        let legacy = msg
            .get("function_call")
            .filter(|v| v.is_object())
            .map(|fc| CallIn {
                id: String::new(),
                name: fc
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                arguments: arguments_text(fc.get("arguments")),
            });
        calls.extend(legacy);
        let j = judge.judge(&text, &calls);
        if let Some(e) = j.terminate {
            return Err(e);
        }
        done.extend(j.interventions.iter().cloned());
        apply_to_message(msg, &j, n_tools, calls.len());
        if j.stop
            && let Some(c) = choice.as_object_mut()
        {
            c.insert("finish_reason".into(), Value::String("stop".into()));
        }
    }
    Ok(done)
}

fn apply_to_message(msg: &mut Map<String, Value>, j: &Judged, n_tools: usize, n_calls: usize) {
    if n_tools > 0 {
        let kept: Vec<Value> = match msg.get("tool_calls") {
            Some(Value::Array(tc)) => j
                .released
                .iter()
                .filter(|&&i| i < n_tools)
                .filter_map(|&i| tc.get(i).cloned())
                .collect(),
            _ => Vec::new(),
        };
        if kept.is_empty() {
            msg.remove("tool_calls");
        } else if kept.len() < n_tools {
            msg.insert("tool_calls".into(), Value::Array(kept));
        }
    }
    if n_calls > n_tools && !j.released.contains(&n_tools) {
        msg.remove("function_call");
    }
    if j.stop
        && let Some(note) = &j.note
    {
        let content = msg.entry("content").or_insert(Value::Null);
        append_text(content, note);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// Blocks calls whose name is in `block`, terminates on `stop`, records what it saw.
    #[derive(Debug, Default)]
    pub struct Scripted {
        pub block: Vec<&'static str>,
        pub stop: Vec<&'static str>,
        pub seen: Vec<(String, Vec<CallIn>)>,
    }

    impl Judge for Scripted {
        fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged {
            self.seen.push((text.to_owned(), calls.to_vec()));
            if calls.iter().any(|c| self.stop.contains(&c.name.as_str())) {
                return Judged {
                    terminate: Some(ApiError::invalid_request("loop_detected", "stopped")),
                    ..Judged::default()
                };
            }
            let released: Vec<usize> = (0..calls.len())
                .filter(|&i| !self.block.contains(&calls[i].name.as_str()))
                .collect();
            let withheld = released.len() < calls.len();
            let interventions = calls
                .iter()
                .filter(|c| self.block.contains(&c.name.as_str()))
                .map(|c| Intervention {
                    action: "block",
                    detector: "scripted".to_owned(),
                    rule: "ladders.test[1]".to_owned(),
                    count: 2,
                    tool_call_id: Some(c.id.clone()),
                })
                .collect();
            Judged {
                stop: withheld && released.is_empty(),
                note: withheld.then(|| "[loopguard] Refused".to_owned()),
                released,
                interventions,
                terminate: None,
            }
        }
    }

    fn completion(calls: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": calls}}]
        })
    }

    fn tc(id: &str, name: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{\"a\":1}"}})
    }

    #[test]
    fn partial_block_keeps_the_released_calls_paired() {
        let mut body = completion(json!([tc("c1", "read"), tc("c2", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        rewrite_response(&mut body, &mut j).unwrap();
        let msg = &body["choices"][0]["message"];
        assert_eq!(msg["tool_calls"].as_array().unwrap().len(), 1);
        assert_eq!(msg["tool_calls"][0]["id"], "c1");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        assert!(msg["content"].is_null());
        assert_eq!(j.seen[0].1[1].arguments, "{\"a\":1}");
    }

    #[test]
    fn a_fully_blocked_turn_stops_with_the_note() {
        let mut body = completion(json!([tc("c1", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        rewrite_response(&mut body, &mut j).unwrap();
        let msg = &body["choices"][0]["message"];
        assert!(msg.get("tool_calls").is_none());
        assert_eq!(msg["content"], "[loopguard] Refused");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn terminate_becomes_the_error() {
        let mut body = completion(json!([tc("c1", "bash")]));
        let mut j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let e = rewrite_response(&mut body, &mut j).unwrap_err();
        assert_eq!(e.code, "loop_detected");
    }

    #[test]
    fn allowed_responses_are_unchanged() {
        let body = completion(json!([tc("c1", "read")]));
        let mut out = body.clone();
        rewrite_response(&mut out, &mut Scripted::default()).unwrap();
        assert_eq!(out, body);
        let text = json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hello"}}]});
        let mut out = text.clone();
        let mut j = Scripted::default();
        rewrite_response(&mut out, &mut j).unwrap();
        assert_eq!(out, text);
        assert_eq!(j.seen[0].0, "hello");
    }

    #[test]
    fn legacy_function_calls_are_judged_too() {
        let mut body = json!({"choices": [{"index": 0, "finish_reason": "function_call",
            "message": {"role": "assistant", "content": null,
                "function_call": {"name": "bash", "arguments": "{}"}}}]});
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        rewrite_response(&mut body, &mut j).unwrap();
        assert!(body["choices"][0]["message"].get("function_call").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn malformed_shapes_are_upstream_errors() {
        for mut bad in [
            json!([1]),
            json!({"choices": 3}),
            json!({"choices": [{"message": {"tool_calls": "x"}}]}),
        ] {
            let e = rewrite_response(&mut bad, &mut Scripted::default()).unwrap_err();
            assert_eq!(e.code, "upstream_malformed");
            assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        }
    }
}
