//! OpenAI chat completions (`POST /v1/chat/completions`).
//!
//! A whole response: every choice's message is judged (its text, then its `tool_calls` and a
//! legacy `function_call`); withheld calls leave `tool_calls`, and a message left with none
//! gets the note in its content and `finish_reason: "stop"`.
//!
//! A stream, per choice:
//!
//! 1. A chunk's text (`delta.content`, reasoning, role) passes through at once. Its
//!    `delta.tool_calls` fragments are taken out and assembled per call `index` (id, name,
//!    arguments concatenated); a chunk left with nothing else is dropped.
//! 2. When the choice's `finish_reason` arrives (or `[DONE]`, or the end of the stream), the turn
//!    is judged: text first, then each call in order. Released calls are sent as one chunk each,
//!    whole, renumbered `0, 1, …` so the client's indices stay dense; then the finishing chunk.
//!    A turn whose calls were all withheld gets the refusal as a content delta and
//!    `finish_reason: "stop"`. What the proxy did comes first, as a chunk with no choices and a
//!    `loopguard` field.
//! 3. A terminate verdict ends the stream with a final `data: {"error": …}` event (no `[DONE]`).
//!
//! A call is therefore never released before it was judged, and unreleased calls leave no
//! trace in the client's stream.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{ENTRY_COST, Rewriter, Rewritten, StreamState, Wire, append_text, text_of};
use crate::judge::{CallIn, Judge, Judged, body_field};
use crate::sse;

/// Largest total of buffered tool-call text accepted (each choice and call held counts
/// [`ENTRY_COST`] besides its text).
pub const MAX_BUFFERED: usize = 16 << 20;

/// Most of a turn's plain text kept for judging (every choice together). Text passes to the
/// client at once whatever its length; beyond this much, the rest of the turn is not judged
/// (the engine scans at most `chanting.max_message_chars` characters of a message anyway).
pub const MAX_TEXT: usize = 16 << 20;

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

/// Arguments as text: a string as it is, anything else as its JSON.
pub(crate) fn arguments_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Judges every choice of a chat completion and rewrites it.
pub fn rewrite(body: &mut Value, judge: &mut dyn Judge) -> Rewritten {
    let mut done = Vec::new();
    let Some(obj) = body.as_object_mut() else {
        return Rewritten::Malformed("the body is not a JSON object".into());
    };
    let choices = match obj.get_mut("choices") {
        Some(Value::Array(c)) => c,
        None | Some(Value::Null) => return Rewritten::Judged(done),
        Some(_) => return Rewritten::Malformed("`choices` is not an array".into()),
    };
    for choice in choices.iter_mut() {
        let Some(Value::Object(msg)) = choice.get_mut("message") else {
            continue;
        };
        let text = text_of(msg.get("content"));
        let mut calls: Vec<CallIn> = match msg.get("tool_calls") {
            Some(Value::Array(tc)) => tc.iter().map(call_of).collect(),
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Rewritten::Malformed("`tool_calls` is not an array".into()),
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
            return Rewritten::Stop(e);
        }
        done.extend(j.interventions.iter().cloned());
        apply_to_message(msg, &j, n_tools, calls.len());
        if j.stop
            && let Some(c) = choice.as_object_mut()
        {
            c.insert("finish_reason".into(), Value::String("stop".into()));
        }
    }
    if !done.is_empty() {
        obj.insert("loopguard".into(), body_field(&done));
    }
    Rewritten::Judged(done)
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
    if n_calls > n_tools && !j.releases(n_tools) {
        msg.remove("function_call");
    }
    if j.stop
        && let Some(note) = &j.note
    {
        let content = msg.entry("content").or_insert(Value::Null);
        append_text(content, note, "text");
    }
}

/// The proxy's own answer, as a completion or a stream of chunks.
pub fn reply(text: &str, model: &str, id: u64, stream: bool) -> String {
    let id = format!("chatcmpl-loopguard-{id}");
    let created = crate::state::now_ms() / 1000;
    if !stream {
        return json!({
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
        })
        .to_string();
    }
    let chunk = |delta: Value, finish: Value| {
        sse::data(&json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        }))
    };
    [
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

/// The request again with the first answer's message and a failed tool result for `call`.
pub fn retry(request: &Value, answer: &Value, call: &CallIn, guidance: &str) -> Option<Value> {
    let message = answer.get("choices")?.get(0)?.get("message")?.clone();
    let mut body = request.clone();
    let messages = body.get_mut("messages")?.as_array_mut()?;
    messages.push(message);
    messages.push(json!({
        "role": "tool",
        "tool_call_id": call.id,
        "content": guidance,
    }));
    Some(body)
}

/// The whole answer a stream assembles to (the first choice's message), for a retry.
fn assembled(envelope: &Map<String, Value>, text: &str, calls: &[&CallBuf]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let mut out = envelope.clone();
    out.insert(
        "choices".into(),
        json!([{"index": 0, "message": message, "finish_reason": "tool_calls"}]),
    );
    Value::Object(out)
}

#[derive(Debug, Default)]
struct CallBuf {
    id: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Default)]
struct ChoiceBuf {
    text: String,
    calls: BTreeMap<u64, CallBuf>,
    legacy: Option<CallBuf>,
    judged: bool,
}

impl ChoiceBuf {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.calls.is_empty() && self.legacy.is_none()
    }
}

/// The stream rewriter of chat completions.
#[derive(Debug)]
pub struct Stream<J> {
    judge: J,
    splitter: sse::Splitter,
    choices: BTreeMap<u64, ChoiceBuf>,
    buffered: usize,
    /// Plain text kept for judging, every choice together (at most [`MAX_TEXT`]).
    text_bytes: usize,
    envelope: Map<String, Value>,
    state: StreamState,
}

impl<J: Judge> Stream<J> {
    /// A rewriter judging with `judge`.
    pub fn new(judge: J) -> Stream<J> {
        Stream {
            judge,
            splitter: sse::Splitter::default(),
            choices: BTreeMap::new(),
            buffered: 0,
            text_bytes: 0,
            envelope: Map::new(),
            state: StreamState::default(),
        }
    }

    /// The whole answer the stream assembled (its first choice), for a retry.
    pub fn answer(&self) -> Option<Value> {
        let buf = self.choices.get(&0)?;
        let calls: Vec<&CallBuf> = buf.calls.values().collect();
        Some(assembled(&self.envelope, &buf.text, &calls))
    }

    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>) {
        let Some(data) = ev.data else {
            out.push(ev.raw);
            return;
        };
        if data.trim() == "[DONE]" {
            self.flush_pending(out);
            if !self.state.closed {
                out.push(ev.raw);
            }
            return;
        }
        let chunk: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(e) => {
                self.state
                    .fail(Wire::Chat, out, &format!("an event is not JSON ({e})"));
                return;
            }
        };
        let Value::Object(mut chunk) = chunk else {
            self.state
                .fail(Wire::Chat, out, "an event is not a JSON object");
            return;
        };
        if chunk.contains_key("error") {
            self.state.upstream_error = true;
            let mut error = Value::Object(chunk);
            if self.judge.redact(&mut error) || self.judge.quotes_secret(&ev.raw) {
                out.push(match &ev.event {
                    Some(name) => sse::event(name, &error),
                    None => sse::data(&error),
                });
            } else {
                out.push(ev.raw);
            }
            return;
        }
        let Some(Value::Array(choices)) = chunk.remove("choices") else {
            // No choices (a usage-only chunk has an empty array; this has none at all).
            out.push(ev.raw);
            return;
        };
        if self.envelope.is_empty() {
            // The chunks' envelope (id, object, created, model) is the same in every chunk of
            // a stream: kept once, for the chunks the proxy writes.
            self.envelope = chunk.clone();
            self.envelope.remove("usage");
        }
        let mut modified = false;
        let mut pre = Vec::new();
        let mut kept = Vec::with_capacity(choices.len());
        let had_choices = !choices.is_empty();
        for mut choice in choices {
            let idx = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let stripped = self.take_calls(idx, &mut choice);
            if self.buffered > MAX_BUFFERED {
                self.state
                    .fail(Wire::Chat, out, "tool calls larger than 16 MiB");
                return;
            }
            modified |= stripped;
            let finishing = choice.get("finish_reason").is_some_and(|f| !f.is_null());
            if finishing {
                let judged = self.judge_choice(idx);
                if let Some(e) = judged.terminate {
                    out.extend(pre);
                    self.state.stop(Wire::Chat, out, e);
                    return;
                }
                let (events, stop) = self.release(idx, &judged);
                self.state.committed |= !events.is_empty();
                modified |= !events.is_empty();
                if !judged.interventions.is_empty() {
                    pre.push(self.interventions_event(&judged));
                    modified = true;
                }
                pre.extend(events);
                if stop && let Some(c) = choice.as_object_mut() {
                    c.insert("finish_reason".into(), json!("stop"));
                    modified = true;
                }
            }
            let empty_delta = choice
                .get("delta")
                .and_then(Value::as_object)
                .is_none_or(Map::is_empty);
            let bare = stripped
                && empty_delta
                && !finishing
                && choice.get("logprobs").is_none_or(Value::is_null);
            if !bare {
                kept.push(choice);
            }
        }
        self.state.committed |= kept.iter().any(substantive);
        if !modified {
            out.push(ev.raw);
            return;
        }
        out.extend(pre);
        if kept.is_empty() && had_choices && chunk.get("usage").is_none_or(Value::is_null) {
            return;
        }
        chunk.insert("choices".into(), Value::Array(kept));
        out.push(sse::data(&Value::Object(chunk)));
    }

    /// Moves a choice's tool-call fragments into its buffer; true when there were any.
    fn take_calls(&mut self, idx: u64, choice: &mut Value) -> bool {
        let Some(Value::Object(delta)) = choice.get_mut("delta") else {
            return false;
        };
        if !self.choices.contains_key(&idx) {
            self.buffered += ENTRY_COST;
        }
        let buf = self.choices.entry(idx).or_default();
        if let Some(Value::String(t)) = delta.get("content") {
            let room = MAX_TEXT.saturating_sub(self.text_bytes);
            let mut take = t.len().min(room);
            while !t.is_char_boundary(take) {
                take -= 1;
            }
            buf.text.push_str(&t[..take]);
            self.text_bytes += take;
        }
        let mut stripped = false;
        if let Some(tc) = delta.remove("tool_calls") {
            stripped = true;
            if let Value::Array(parts) = tc {
                for (pos, part) in parts.iter().enumerate() {
                    let i = part
                        .get("index")
                        .and_then(Value::as_u64)
                        .unwrap_or(pos as u64);
                    if !buf.calls.contains_key(&i) {
                        self.buffered += ENTRY_COST;
                    }
                    let call = buf.calls.entry(i).or_default();
                    self.buffered += merge(call, part.get("id"), part.get("function"));
                }
            }
        }
        if let Some(fc) = delta.remove("function_call") {
            stripped = true;
            let call = buf.legacy.get_or_insert_with(CallBuf::default);
            self.buffered += merge(call, None, Some(&fc));
        }
        stripped
    }

    fn judge_choice(&mut self, idx: u64) -> Judged {
        if !self.choices.contains_key(&idx) {
            self.buffered += ENTRY_COST;
        }
        let buf = self.choices.entry(idx).or_default();
        if buf.judged {
            return Judged::default();
        }
        buf.judged = true;
        let calls: Vec<CallIn> = buf
            .calls
            .values()
            .chain(buf.legacy.as_ref())
            .map(|c| CallIn {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        let text = buf.text.clone();
        let judged = self.judge.judge(&text, &calls);
        self.state
            .interventions
            .extend(judged.interventions.iter().cloned());
        judged
    }

    /// The events releasing a judged choice's calls, and whether the turn must stop.
    fn release(&mut self, idx: u64, judged: &Judged) -> (Vec<String>, bool) {
        let mut events = Vec::new();
        let Some(buf) = self.choices.get(&idx) else {
            return (events, false);
        };
        let n_tools = buf.calls.len();
        let tools: Vec<&CallBuf> = buf.calls.values().collect();
        let mut k = 0;
        for &i in &judged.released {
            let delta = if let Some(c) = tools.get(i) {
                let d = json!({"tool_calls": [{
                    "index": k,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }]});
                k += 1;
                d
            } else if let (true, Some(c)) = (i >= n_tools, &buf.legacy) {
                json!({"function_call": {"name": c.name, "arguments": c.arguments}})
            } else {
                continue;
            };
            events.push(self.synth(idx, delta));
        }
        if judged.stop {
            if let Some(note) = &judged.note {
                let sep = if buf.text.is_empty() { "" } else { "\n\n" };
                events.push(self.synth(idx, json!({"content": format!("{sep}{note}")})));
            }
            return (events, true);
        }
        (events, false)
    }

    /// A chunk with no choices that carries what the proxy did in a turn (the `loopguard`
    /// field, as in a whole response).
    fn interventions_event(&self, judged: &Judged) -> String {
        let mut chunk = self.envelope.clone();
        chunk.insert("choices".into(), json!([]));
        chunk.insert("loopguard".into(), body_field(&judged.interventions));
        sse::data(&Value::Object(chunk))
    }

    fn synth(&self, idx: u64, delta: Value) -> String {
        let mut chunk = self.envelope.clone();
        chunk.insert(
            "choices".into(),
            json!([{"index": idx, "delta": delta, "finish_reason": null}]),
        );
        sse::data(&Value::Object(chunk))
    }

    fn flush_pending(&mut self, out: &mut Vec<String>) {
        let open: Vec<u64> = self
            .choices
            .iter()
            .filter(|(_, c)| !c.judged && !c.is_empty())
            .map(|(i, _)| *i)
            .collect();
        for idx in open {
            let judged = self.judge_choice(idx);
            if let Some(e) = judged.terminate {
                self.state.stop(Wire::Chat, out, e);
                return;
            }
            let (events, _) = self.release(idx, &judged);
            self.state.committed |= !events.is_empty();
            if !judged.interventions.is_empty() {
                out.push(self.interventions_event(&judged));
            }
            out.extend(events);
        }
    }
}

impl<J: Judge> super::Events for Stream<J> {
    const WIRE: Wire = Wire::Chat;

    fn splitter(&mut self) -> &mut sse::Splitter {
        &mut self.splitter
    }

    fn stream_state(&mut self) -> &mut StreamState {
        &mut self.state
    }

    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>) {
        Stream::on_event(self, ev, out);
    }

    fn at_end(&mut self, out: &mut Vec<String>) {
        self.flush_pending(out);
    }
}

impl<J: Judge> Rewriter<J> for Stream<J> {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        super::feed(self, bytes)
    }

    fn finish(&mut self) -> Vec<String> {
        super::end(self)
    }

    fn state(&self) -> &StreamState {
        &self.state
    }

    fn judge(&mut self) -> &mut J {
        &mut self.judge
    }

    fn into_judge(self: Box<Self>) -> J {
        self.judge
    }

    fn abandon(&mut self) -> usize {
        self.choices
            .values()
            .filter(|c| !c.judged)
            .map(|c| c.calls.len() + usize::from(c.legacy.is_some()))
            .sum()
    }

    fn answer(&self) -> Option<Value> {
        Stream::answer(self)
    }
}

/// A choice the client must see as soon as it is sent: text, reasoning, a call, or a finish
/// (a bare role announcement is not).
fn substantive(choice: &Value) -> bool {
    let finished = choice.get("finish_reason").is_some_and(|f| !f.is_null());
    let delta = choice.get("delta").and_then(Value::as_object);
    finished
        || delta.is_some_and(|d| {
            d.iter().any(|(k, v)| match v {
                Value::Null => false,
                Value::String(s) => k != "role" && !s.is_empty(),
                _ => true,
            })
        })
}

/// Adds one fragment to a call; returns the bytes added.
fn merge(call: &mut CallBuf, id: Option<&Value>, function: Option<&Value>) -> usize {
    let mut added = 0;
    if let Some(Value::String(id)) = id
        && call.id.is_empty()
    {
        call.id.clone_from(id);
        added += id.len();
    }
    if let Some(f) = function {
        if let Some(Value::String(name)) = f.get("name")
            && !name.is_empty()
            && call.name != *name
        {
            // Most servers send the name once; some repeat it whole in every fragment.
            call.name.push_str(name);
            added += name.len();
        }
        if let Some(Value::String(args)) = f.get("arguments") {
            call.arguments.push_str(args);
            added += args.len();
        }
    }
    added
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::judge::tests::Scripted;
    use axum::http::StatusCode;

    // --- whole responses

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

    fn judged(body: &mut Value, j: &mut Scripted) -> Vec<crate::judge::Intervention> {
        match rewrite(body, j) {
            Rewritten::Judged(done) => done,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn partial_block_keeps_the_released_calls_paired() {
        let mut body = completion(json!([tc("c1", "read"), tc("c2", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        judged(&mut body, &mut j);
        let msg = &body["choices"][0]["message"];
        assert_eq!(msg["tool_calls"].as_array().unwrap().len(), 1);
        assert_eq!(msg["tool_calls"][0]["id"], "c1");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        assert!(msg["content"].is_null());
        assert_eq!(j.seen[0].1[1].arguments, "{\"a\":1}");
        assert_eq!(body["loopguard"]["interventions"][0]["action"], "block");
    }

    #[test]
    fn a_fully_blocked_turn_stops_with_the_note() {
        let mut body = completion(json!([tc("c1", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        judged(&mut body, &mut j);
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
        let Rewritten::Stop(e) = rewrite(&mut body, &mut j) else {
            panic!("a stop")
        };
        assert_eq!(e.code, "tool_loop_terminated");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn allowed_responses_are_unchanged() {
        let body = completion(json!([tc("c1", "read")]));
        let mut out = body.clone();
        judged(&mut out, &mut Scripted::default());
        assert_eq!(out, body);
        let text = json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hello"}}]});
        let mut out = text.clone();
        let mut j = Scripted::default();
        judged(&mut out, &mut j);
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
        judged(&mut body, &mut j);
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
            assert!(matches!(
                rewrite(&mut bad, &mut Scripted::default()),
                Rewritten::Malformed(_)
            ));
        }
    }

    #[test]
    fn a_retry_appends_the_answer_and_a_failed_result() {
        let request = json!({"model": "m", "messages": [{"role": "user", "content": "go"}]});
        let answer = completion(json!([tc("c1", "bash")]));
        let call = call_of(&tc("c1", "bash"));
        let again = retry(&request, &answer, &call, "failed").unwrap();
        let m = again["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["tool_calls"][0]["id"], "c1");
        assert_eq!(
            m[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "failed"})
        );
    }

    // --- streams

    fn chunk(delta: Value, finish: Option<&str>) -> String {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    }

    fn frag(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
        let mut f = json!({"arguments": args});
        if let Some(n) = name {
            f["name"] = json!(n);
        }
        let mut tc = json!({"index": index, "function": f});
        if let Some(id) = id {
            tc["id"] = json!(id);
            tc["type"] = json!("function");
        }
        json!({"tool_calls": [tc]})
    }

    /// An upstream stream: text, then two calls in fragments, then the end.
    fn upstream() -> String {
        [
            chunk(json!({"role": "assistant", "content": ""}), None),
            chunk(json!({"content": "Let me "}), None),
            chunk(json!({"content": "look."}), None),
            chunk(frag(0, Some("call_a"), Some("read"), ""), None),
            chunk(frag(0, None, None, "{\"pa"), None),
            chunk(frag(0, None, None, "th\":\"a\"}"), None),
            chunk(frag(1, Some("call_b"), Some("bash"), "{\"comm"), None),
            chunk(frag(1, None, None, "and\":\"ls\"}"), None),
            chunk(json!({}), Some("tool_calls")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat()
    }

    fn data(events: &[String]) -> Vec<Value> {
        events
            .iter()
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| !d.starts_with("[DONE]"))
            .map(|d| serde_json::from_str(d.trim()).unwrap())
            .collect()
    }

    /// Feeds the stream in pieces of `step` bytes.
    fn run(j: Scripted, input: &str, step: usize) -> (Vec<String>, Stream<Scripted>) {
        let mut s = Stream::new(j);
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(step) {
            out.extend(s.push(piece));
        }
        out.extend(s.finish());
        (out, s)
    }

    #[test]
    fn plain_text_kept_for_judging_is_bounded_and_all_of_it_reaches_the_client() {
        // 20 MiB of text in 64 KiB deltas (multi-byte characters at the cut): the client gets
        // every byte, the judge at most MAX_TEXT of it, cut on a character boundary.
        let piece = "é".repeat(32 * 1024);
        let mut s = Stream::new(Scripted::default());
        let mut sent = 0usize;
        let mut passed = 0usize;
        let mut count = |events: Vec<String>| {
            for d in data(&events) {
                if let Some(t) = d["choices"][0]["delta"]["content"].as_str() {
                    passed += t.len();
                }
            }
        };
        while sent < 20 << 20 {
            count(s.push(chunk(json!({"content": piece}), None).as_bytes()));
            sent += piece.len();
        }
        count(s.push(chunk(json!({}), Some("stop")).as_bytes()));
        count(s.push(b"data: [DONE]\n\n"));
        count(s.finish());
        assert_eq!(passed, sent);
        let (text, _) = &s.judge.seen[0];
        assert!(
            text.len() <= MAX_TEXT && text.len() > MAX_TEXT - 4,
            "{}",
            text.len()
        );
        assert!(s.text_bytes <= MAX_TEXT);
    }

    #[test]
    fn many_empty_choices_and_calls_are_bounded_like_long_ones() {
        // Empty calls and choices under new indices, a thousand per chunk: the stream fails
        // once they count for more than the buffer limit, however few bytes they hold.
        let calls: Vec<Value> = (0..1000).map(|i| json!({"index": i})).collect();
        let choices: Vec<Value> = (0..1000)
            .map(|i| json!({"index": i + 1, "delta": {}, "finish_reason": null}))
            .collect();
        let mut s = Stream::new(Scripted::default());
        for n in 0..200u64 {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"index": c["index"].as_u64().unwrap() + n * 1000}))
                .collect();
            s.push(chunk(json!({"tool_calls": calls}), None).as_bytes());
            let choices: Vec<Value> = choices
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    c["index"] = json!(c["index"].as_u64().unwrap() + n * 1000);
                    c
                })
                .collect();
            let c = json!({"id": "c1", "object": "chat.completion.chunk", "choices": choices});
            s.push(format!("data: {c}\n\n").as_bytes());
            if s.state.closed {
                break;
            }
        }
        assert!(s.state.closed && s.state.malformed);
        let held: usize =
            s.choices.len() + s.choices.values().map(|c| c.calls.len()).sum::<usize>();
        assert!(held <= MAX_BUFFERED / ENTRY_COST + 2000, "{held}");
    }

    #[test]
    fn fragments_are_assembled_and_judged_once_whole() {
        for step in [1, 7, 64, 4096] {
            let (out, s) = run(Scripted::default(), &upstream(), step);
            let j = &s.judge;
            assert_eq!(j.seen.len(), 1, "one turn judged");
            let (text, calls) = &j.seen[0];
            assert_eq!(text, "Let me look.");
            assert_eq!(calls[0].arguments, "{\"path\":\"a\"}");
            assert_eq!(calls[1].id, "call_b");
            assert_eq!(calls[1].arguments, "{\"command\":\"ls\"}");
            let chunks = data(&out);
            // role, 2 text chunks, 2 released calls, finish.
            assert_eq!(chunks.len(), 6, "{out:?}");
            assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Let me ");
            let c0 = &chunks[3]["choices"][0]["delta"]["tool_calls"][0];
            assert_eq!(c0["index"], 0);
            assert_eq!(c0["id"], "call_a");
            assert_eq!(c0["function"]["name"], "read");
            let c1 = &chunks[4]["choices"][0]["delta"]["tool_calls"][0];
            assert_eq!(c1["index"], 1);
            assert_eq!(c1["function"]["arguments"], "{\"command\":\"ls\"}");
            assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
            assert_eq!(out.last().unwrap(), "data: [DONE]\n\n");
            // The assembled answer, for a retry.
            let answer = s.answer().unwrap();
            assert_eq!(
                answer["choices"][0]["message"]["tool_calls"][1]["id"],
                "call_b"
            );
        }
    }

    #[test]
    fn text_passes_before_the_turn_ends() {
        let mut s = Stream::new(Scripted::default());
        let first = s.push(chunk(json!({"content": "hi"}), None).as_bytes());
        assert_eq!(first.len(), 1, "text is not held back");
        let held = s.push(chunk(frag(0, Some("c"), Some("read"), "{}"), None).as_bytes());
        assert!(held.is_empty(), "a call is held until judged");
    }

    #[test]
    fn a_withheld_call_is_renumbered_around() {
        let j = Scripted {
            block: vec!["read"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 5);
        let chunks = data(&out);
        let calls: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0][0]["index"], 0);
        assert_eq!(calls[0][0]["id"], "call_b");
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }

    #[test]
    fn all_withheld_ends_the_turn_with_the_note() {
        let j = Scripted {
            block: vec!["read", "bash"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 11);
        let chunks = data(&out);
        assert!(
            chunks
                .iter()
                .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none())
        );
        let note = &chunks[chunks.len() - 2]["choices"][0]["delta"]["content"];
        assert_eq!(note, "\n\n[loopguard] Refused");
        // Before the note, a chunk without choices says what the proxy did, call by call.
        let said = &chunks[chunks.len() - 3];
        assert_eq!(said["choices"], json!([]));
        let done = said["loopguard"]["interventions"].as_array().unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(done[0]["action"], "block");
        assert_eq!(done[0]["tool_call_id"], "call_a");
        assert_eq!(said["id"], chunks[0]["id"]);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
        assert_eq!(out.last().unwrap(), "data: [DONE]\n\n");
    }

    #[test]
    fn terminate_is_the_last_event() {
        let j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let (out, s) = run(j, &upstream(), 3);
        let last = out.last().unwrap();
        assert!(last.starts_with("data: {\"error\":"), "{last}");
        assert!(!out.iter().any(|e| e.contains("[DONE]")));
        assert!(!out.iter().any(|e| e.contains("call_a")));
        assert!(s.state().terminated.is_some());
    }

    #[test]
    fn a_stream_cut_short_still_judges_its_calls() {
        let input = [
            chunk(frag(0, Some("c9"), Some("read"), "{\"p\":"), None),
            chunk(frag(0, None, None, "1}"), None),
        ]
        .concat();
        let (out, s) = run(Scripted::default(), &input, 9);
        assert_eq!(s.judge.seen[0].1[0].arguments, "{\"p\":1}");
        assert_eq!(
            data(&out)[0]["choices"][0]["delta"]["tool_calls"][0]["id"],
            "c9"
        );
    }

    #[test]
    fn comments_crlf_and_usage_chunks_pass_through() {
        let input = ": keep-alive\r\n\r\ndata: {\"id\":\"x\",\"choices\":[],\"usage\":{\"total_tokens\":3}}\r\n\r\n";
        let (out, _) = run(Scripted::default(), input, 2);
        assert_eq!(out[0], ": keep-alive\n\n");
        assert!(out[1].contains("total_tokens"));
    }

    #[test]
    fn garbage_is_a_malformed_error() {
        let mut s = Stream::new(Scripted::default());
        let out = s.push(b"data: {not json\n\n");
        assert!(s.state().malformed && s.state().closed);
        assert!(out[0].contains("upstream_malformed"));
        assert!(s.push(b"data: {}\n\n").is_empty());
    }

    #[test]
    fn upstream_error_events_pass_and_are_noted() {
        let mut s = Stream::new(Scripted::default());
        let out = s.push(b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n");
        assert!(s.state().upstream_error);
        assert!(out[0].contains("overloaded"));
    }

    #[test]
    fn text_only_turns_are_judged_as_text() {
        let input = [
            chunk(json!({"content": "Hello"}), None),
            chunk(json!({}), Some("stop")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let (out, s) = run(Scripted::default(), &input, 4);
        assert_eq!(s.judge.seen, vec![("Hello".to_owned(), Vec::new())]);
        let events: Vec<String> = input.split_inclusive("\n\n").map(str::to_owned).collect();
        assert_eq!(out, events);
    }

    #[test]
    fn no_input_panics() {
        for input in [
            "data: []\n\n",
            "data: 3\n\n",
            "data: {\"choices\": 1}\n\n",
            "data: {\"choices\": [{\"delta\": {\"tool_calls\": 5}, \"finish_reason\": \"x\"}]}\n\n",
            "data: {\"choices\": [{\"index\": -1, \"delta\": {\"tool_calls\": [{\"index\": \"a\", \"function\": 7}]}}]}\n\n",
            "\n\n\n\ndata:\n\n",
            "data: {\"choices\": [{\"delta\": {\"function_call\": {\"name\": \"f\"}}, \"finish_reason\": \"function_call\"}]}\n\n",
        ] {
            let _ = run(Scripted::default(), input, 3);
        }
    }
}
