//! OpenAI Responses (`POST /v1/responses`).
//!
//! Calls are `function_call` (and `custom_tool_call`, `local_shell_call`) output items; results
//! are the `function_call_output` items of the next request's `input`. A request may carry
//! the whole conversation, or only what is new with `previous_response_id` naming the stored
//! response it continues: the proxy then remembers, per session, what the upstream stored and
//! the client never saw (a refused call, which the next request answers with the refusal).
//!
//! A whole response: the `output` items are judged (message text, then each call); withheld
//! call items leave `output`, and a turn left with none gets the note as a message item. What
//! the proxy did is the `loopguard` field.
//!
//! A stream (`response.created`, `response.output_item.added` / `.done`,
//! `response.output_text.delta`, `response.function_call_arguments.delta` / `.done`,
//! `response.completed`, …): items other than calls pass through at once; a call item and its
//! argument events are held and assembled. At `response.completed` (or `.incomplete`,
//! `.failed`), or at the end of the stream, the turn is judged: released calls are sent as whole
//! items, a turn whose calls were all withheld gets the note as a message item, and the final
//! event's `response` is rewritten to match (with the `loopguard` field). `output_index` and
//! `sequence_number` are renumbered so the client's stay dense. A terminate verdict ends the
//! stream with an `error` event.

use std::collections::BTreeMap;

use loopguard_transcript::messages;
use serde_json::{Map, Value, json};

use super::{ENTRY_COST, Rewriter, Rewritten, StreamState, Wire, text_of};
use crate::judge::{CallIn, Judge, Judged, body_field};
use crate::sse;

/// Most of a turn's text kept for judging (the client gets all of it).
const MAX_TEXT: usize = 16 << 20;
/// Largest total of buffered call arguments accepted (each item held counts [`ENTRY_COST`]
/// besides its text).
const MAX_BUFFERED: usize = 16 << 20;

fn item_type(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or_default()
}

fn is_call(v: &Value) -> bool {
    v.as_object().and_then(messages::responses_call).is_some()
}

/// A call item as a call (the conversation reader's reading of it).
fn call_of(v: &Value) -> CallIn {
    let Some(call) = v.as_object().and_then(messages::responses_call) else {
        return CallIn::default();
    };
    let id = call.id.and_then(Value::as_str).unwrap_or_default();
    let (name, arguments) = (
        call.name.to_owned(),
        super::chat::arguments_text(call.arguments),
    );
    CallIn {
        id: id.to_owned(),
        name,
        arguments,
    }
}

/// The text of an output message item.
fn message_text(v: &Value) -> Option<String> {
    (item_type(v) == "message").then(|| text_of(v.get("content")))
}

/// An assistant message item holding `note`.
fn note_item(id: &str, note: &str) -> Value {
    json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": note, "annotations": []}]})
}

/// The function call output answering a call the proxy withheld from a stored response.
pub fn withheld_output(call_id: &str, note: &str) -> Value {
    json!({"type": "function_call_output", "call_id": call_id, "output": note})
}

/// Judges a whole response and rewrites its `output`.
pub fn rewrite(body: &mut Value, judge: &mut dyn Judge) -> Rewritten {
    let Some(obj) = body.as_object_mut() else {
        return Rewritten::Malformed("the body is not a JSON object".into());
    };
    let id = obj.get("id").and_then(Value::as_str);
    if let Some(id) = id {
        judge.set_response_id(id);
    }
    let id = id.unwrap_or("resp").to_owned();
    let output = match obj.get_mut("output") {
        Some(Value::Array(o)) => o,
        None | Some(Value::Null) => return Rewritten::Judged(Vec::new()),
        Some(_) => return Rewritten::Malformed("`output` is not an array".into()),
    };
    let text = output
        .iter()
        .filter_map(message_text)
        .collect::<Vec<_>>()
        .join("\n");
    let calls: Vec<CallIn> = output.iter().filter(|v| is_call(v)).map(call_of).collect();
    let j = judge.judge(&text, &calls);
    if let Some(e) = j.terminate {
        return Rewritten::Stop(e);
    }
    let mut k = 0;
    output.retain(|v| {
        if !is_call(v) {
            return true;
        }
        k += 1;
        j.releases(k - 1)
    });
    if j.stop
        && let Some(note) = &j.note
    {
        output.push(note_item(&format!("msg_loopguard_{id}"), note));
    }
    if !j.interventions.is_empty() {
        obj.insert("loopguard".into(), body_field(&j.interventions));
    }
    Rewritten::Judged(j.interventions)
}

/// The ids of the calls a whole response's upstream answer held that the rewritten body no
/// longer does (withheld by the proxy).
pub fn withheld(upstream: &Value, rewritten: &Value) -> Vec<String> {
    let ids = |v: &Value| -> Vec<String> {
        v.get("output")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|i| is_call(i))
            .map(|i| call_of(i).id)
            .collect()
    };
    let kept = ids(rewritten);
    ids(upstream)
        .into_iter()
        .filter(|id| !kept.contains(id))
        .collect()
}

/// Shows a whole second answer as continuing `previous` (the response the client named)
/// rather than the withheld first answer.
pub fn show_continuing(body: &mut Value, previous: Option<&str>) {
    if let Some(obj) = body.as_object_mut()
        && obj.contains_key("previous_response_id")
    {
        obj.insert(
            "previous_response_id".into(),
            previous.map_or(Value::Null, |p| json!(p)),
        );
    }
}

/// Whether the upstream stores the responses of this request (so a later request may continue
/// from them): `store` is true unless the request says false.
fn stored(request: &Value) -> bool {
    request.get("store").and_then(Value::as_bool) != Some(false)
}

/// The proxy's own answer, as a response or a stream of its events.
pub fn reply(text: &str, model: &str, id: u64, stream: bool) -> String {
    let id = format!("resp_loopguard_{id}");
    let item = note_item(&format!("msg_loopguard_{id}"), text);
    let created = crate::state::now_ms() / 1000;
    let response = |status: &str, output: Value| {
        json!({"id": id, "object": "response", "created_at": created, "status": status,
            "model": model, "output": output, "usage": {"input_tokens": 0, "output_tokens": 0,
            "total_tokens": 0}})
    };
    if !stream {
        return response("completed", json!([item])).to_string();
    }
    let events = [
        json!({"type": "response.created", "response": response("in_progress", json!([]))}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
            "item_id": item["id"], "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": response("completed", json!([item]))}),
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(n, mut e)| {
            e["sequence_number"] = json!(n);
            let name = e["type"].as_str().unwrap_or_default().to_owned();
            sse::event(&name, &e)
        })
        .collect()
}

/// The request again, asking the upstream to go on from its answer with a failed output for
/// `call`: from the stored answer (`previous_response_id`) when the upstream stores responses,
/// else with the answer's items appended to the input.
pub fn retry(request: &Value, answer: &Value, call: &CallIn, guidance: &str) -> Option<Value> {
    let mut body = request.clone();
    let failed = json!({"type": "function_call_output", "call_id": call.id, "output": guidance});
    let obj = body.as_object_mut()?;
    if stored(request)
        && let Some(id) = answer.get("id").and_then(Value::as_str)
    {
        obj.insert("previous_response_id".into(), json!(id));
        obj.insert("input".into(), json!([failed]));
        return Some(body);
    }
    let mut input = match obj.get("input") {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        _ => Vec::new(),
    };
    for item in answer.get("output")?.as_array()? {
        // Reasoning items can be sent back only with their encrypted content.
        if item_type(item) == "reasoning" && item.get("encrypted_content").is_none() {
            continue;
        }
        input.push(item.clone());
    }
    input.push(failed);
    obj.insert("input".into(), Value::Array(input));
    Some(body)
}

/// An output item of the upstream's stream.
#[derive(Debug)]
enum Item {
    /// Passed through, under the client's index `out`.
    Passed { out: u64 },
    /// A call, held until judged: its latest item and its arguments so far.
    Call { item: Value, arguments: String },
}

/// The stream rewriter of OpenAI Responses.
#[derive(Debug)]
pub struct Stream<J> {
    judge: J,
    splitter: sse::Splitter,
    /// Upstream output index → the item.
    items: BTreeMap<u64, Item>,
    next_out: u64,
    next_seq: u64,
    text: String,
    buffered: usize,
    judged: Option<Judged>,
    /// The response object of the latest event carrying one.
    response: Map<String, Value>,
    /// For a second answer: the `previous_response_id` its response objects show (the one the
    /// client named, not the withheld first answer).
    shown_previous: Option<Value>,
    state: StreamState,
}

impl<J: Judge> Stream<J> {
    /// A rewriter judging with `judge`.
    pub fn new(judge: J) -> Stream<J> {
        Stream {
            judge,
            splitter: sse::Splitter::default(),
            items: BTreeMap::new(),
            next_out: 0,
            next_seq: 0,
            text: String::new(),
            buffered: 0,
            judged: None,
            response: Map::new(),
            shown_previous: None,
            state: StreamState::default(),
        }
    }

    fn calls(&self) -> Vec<(CallIn, &Value)> {
        self.items
            .values()
            .filter_map(|i| match i {
                Item::Call { item, arguments } => {
                    let mut c = call_of(item);
                    if !arguments.is_empty() {
                        c.arguments.clone_from(arguments);
                    }
                    Some((c, item))
                }
                Item::Passed { .. } => None,
            })
            .collect()
    }

    /// An event for the client, numbered in the client's sequence.
    fn emit(&mut self, mut data: Map<String, Value>, out: &mut Vec<String>) {
        data.insert("sequence_number".into(), json!(self.next_seq));
        self.next_seq += 1;
        let name = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_owned();
        out.push(sse::event(&name, &Value::Object(data)));
    }

    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>) {
        let Some(data) = &ev.data else {
            out.push(ev.raw);
            return;
        };
        if data.trim() == "[DONE]" {
            out.push(ev.raw);
            return;
        }
        let Ok(Value::Object(mut d)) = serde_json::from_str::<Value>(data) else {
            self.state
                .fail(Wire::Responses, out, "an event is not a JSON object");
            return;
        };
        let ty = d
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default()
            .to_owned();
        if let (Some(Value::Object(r)), Some(shown)) = (d.get_mut("response"), &self.shown_previous)
            && r.contains_key("previous_response_id")
        {
            r.insert("previous_response_id".into(), shown.clone());
        }
        if let Some(Value::Object(r)) = d.get("response") {
            self.response = r.clone();
        }
        let index = d.get("output_index").and_then(Value::as_u64);
        match ty.as_str() {
            "response.output_item.added" | "response.output_item.done" => {
                let idx = index.unwrap_or(0);
                let item = d.get("item").cloned().unwrap_or(Value::Null);
                if is_call(&item) {
                    let size = item.to_string().len();
                    match self.items.get_mut(&idx) {
                        Some(Item::Call { item: held, .. }) => {
                            self.buffered =
                                self.buffered.saturating_sub(held.to_string().len()) + size;
                            *held = item;
                        }
                        _ => {
                            self.buffered += ENTRY_COST + size;
                            self.items.insert(
                                idx,
                                Item::Call {
                                    item,
                                    arguments: String::new(),
                                },
                            );
                        }
                    }
                    self.check_buffered(out);
                    return;
                }
                let o = match self.items.get(&idx) {
                    Some(Item::Passed { out }) => *out,
                    _ => {
                        self.buffered += ENTRY_COST;
                        self.check_buffered(out);
                        if self.state.closed {
                            return;
                        }
                        let o = self.next_out;
                        self.next_out += 1;
                        self.items.insert(idx, Item::Passed { out: o });
                        o
                    }
                };
                if ty == "response.output_item.done"
                    && let Some(t) = message_text(&item)
                    && self.text.is_empty()
                {
                    self.keep_text(&t);
                }
                d.insert("output_index".into(), json!(o));
                self.emit(d, out);
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let judged = self.judge_turn();
                if let Some(e) = judged.terminate.clone() {
                    self.state.stop(Wire::Responses, out, e);
                    return;
                }
                self.release(&judged, out);
                if let Some(Value::Object(r)) = d.get_mut("response") {
                    self.rewrite_final(r, &judged);
                    if let Some(error) = r.get_mut("error") {
                        // A failed response carries the upstream's error.
                        self.judge.redact(error);
                    }
                }
                self.state.committed = true;
                self.emit(d, out);
            }
            "error" => {
                self.state.upstream_error = true;
                let mut error = Value::Object(d);
                self.judge.redact(&mut error);
                if let Value::Object(d) = error {
                    self.emit(d, out);
                }
            }
            _ => match index.and_then(|i| self.items.get_mut(&i)) {
                Some(Item::Call { arguments, .. }) => {
                    if ty.ends_with(".done") {
                        if let Some(a) = d
                            .get("arguments")
                            .or_else(|| d.get("input"))
                            .and_then(Value::as_str)
                        {
                            self.buffered = self.buffered.saturating_sub(arguments.len()) + a.len();
                            *arguments = a.to_owned();
                        }
                    } else if let Some(delta) = d.get("delta").and_then(Value::as_str) {
                        arguments.push_str(delta);
                        self.buffered += delta.len();
                    }
                    self.check_buffered(out);
                }
                Some(Item::Passed { out: o }) => {
                    let o = *o;
                    if ty == "response.output_text.delta"
                        && let Some(t) = d.get("delta").and_then(Value::as_str)
                    {
                        let t = t.to_owned();
                        self.state.committed |= !t.is_empty();
                        self.keep_text(&t);
                    } else if ty.ends_with(".delta") {
                        self.state.committed = true;
                    }
                    d.insert("output_index".into(), json!(o));
                    self.emit(d, out);
                }
                None => self.emit(d, out),
            },
        }
    }

    fn check_buffered(&mut self, out: &mut Vec<String>) {
        if self.buffered > MAX_BUFFERED && !self.state.closed {
            self.state
                .fail(Wire::Responses, out, "call arguments larger than 16 MiB");
        }
    }

    fn keep_text(&mut self, t: &str) {
        let room = MAX_TEXT.saturating_sub(self.text.len());
        let mut take = t.len().min(room);
        while !t.is_char_boundary(take) {
            take -= 1;
        }
        self.text.push_str(&t[..take]);
    }

    fn judge_turn(&mut self) -> Judged {
        if let Some(j) = &self.judged {
            // Judged already (a second final event): release nothing again.
            return Judged {
                released: Vec::new(),
                interventions: Vec::new(),
                stop: false,
                note: None,
                terminate: j.terminate.clone(),
            };
        }
        let calls: Vec<CallIn> = self.calls().into_iter().map(|(c, _)| c).collect();
        // The client continues from this response: the judge remembers what it withholds
        // from it, and whose session it is.
        if let Some(id) = self.response.get("id").and_then(Value::as_str) {
            self.judge.set_response_id(id);
        }
        let judged = self.judge.judge(&self.text, &calls);
        self.state
            .interventions
            .extend(judged.interventions.iter().cloned());
        self.judged = Some(judged.clone());
        judged
    }

    /// The final item of each released call (with its assembled arguments).
    fn released_items(&self, judged: &Judged) -> Vec<Value> {
        let calls = self.calls();
        judged
            .released
            .iter()
            .filter_map(|&i| calls.get(i))
            .map(|(c, item)| {
                let mut item = (*item).clone();
                if item_type(&item) == "function_call" {
                    item["arguments"] = json!(c.arguments);
                }
                if item.get("status").is_some() {
                    item["status"] = json!("completed");
                }
                item
            })
            .collect()
    }

    fn note_id(&self) -> String {
        let id = self
            .response
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("resp");
        format!("msg_loopguard_{id}")
    }

    /// Sends the released calls as whole items, and the note when the turn stops.
    fn release(&mut self, judged: &Judged, out: &mut Vec<String>) {
        for item in self.released_items(judged) {
            let o = self.next_out;
            self.next_out += 1;
            let mut added = item.clone();
            if added.get("status").is_some() {
                added["status"] = json!("in_progress");
            }
            let call_id = item.get("id").cloned().unwrap_or(Value::Null);
            self.emit(
                obj(
                    json!({"type": "response.output_item.added", "output_index": o, "item": added}),
                ),
                out,
            );
            if item_type(&item) == "function_call" {
                self.emit(
                    obj(
                        json!({"type": "response.function_call_arguments.done", "output_index": o,
                        "item_id": call_id, "arguments": item["arguments"]}),
                    ),
                    out,
                );
            }
            self.emit(
                obj(json!({"type": "response.output_item.done", "output_index": o, "item": item})),
                out,
            );
            self.state.committed = true;
        }
        if judged.stop
            && let Some(note) = &judged.note
        {
            let o = self.next_out;
            self.next_out += 1;
            let item = note_item(&self.note_id(), note);
            self.emit(
                obj(json!({"type": "response.output_item.added", "output_index": o, "item": item})),
                out,
            );
            self.emit(
                obj(
                    json!({"type": "response.output_text.delta", "output_index": o,
                    "content_index": 0, "item_id": item["id"], "delta": note}),
                ),
                out,
            );
            self.emit(
                obj(json!({"type": "response.output_item.done", "output_index": o, "item": item})),
                out,
            );
            self.state.committed = true;
        }
    }

    /// The final response object as the client saw the stream: passed items, then the
    /// released calls, then the note.
    fn rewrite_final(&self, r: &mut Map<String, Value>, judged: &Judged) {
        if let Some(Value::Array(output)) = r.get_mut("output") {
            output.retain(|i| !is_call(i));
            output.extend(self.released_items(judged));
            if judged.stop
                && let Some(note) = &judged.note
            {
                output.push(note_item(&self.note_id(), note));
            }
        }
        if !judged.interventions.is_empty() {
            r.insert("loopguard".into(), body_field(&judged.interventions));
        }
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl<J: Judge> super::Events for Stream<J> {
    const WIRE: Wire = Wire::Responses;

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
        let pending = self.items.values().any(|i| matches!(i, Item::Call { .. }));
        if self.judged.is_none() && pending {
            let judged = self.judge_turn();
            match judged.terminate.clone() {
                Some(e) => self.state.stop(Wire::Responses, out, e),
                None => self.release(&judged, out),
            }
        }
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

    fn continues(&mut self, previous: Option<&str>) {
        self.shown_previous = Some(previous.map_or(Value::Null, |p| json!(p)));
    }

    fn abandon(&mut self) -> usize {
        if self.judged.is_some() {
            return 0;
        }
        self.calls().len()
    }

    fn answer(&self) -> Option<Value> {
        let mut r = self.response.clone();
        let mut output = Vec::new();
        if !self.text.is_empty() {
            output.push(note_item("msg_answer", &self.text));
        }
        for (c, item) in self.calls() {
            let mut item = item.clone();
            if item_type(&item) == "function_call" {
                item["arguments"] = json!(c.arguments);
            }
            output.push(item);
        }
        r.insert("output".into(), Value::Array(output));
        Some(Value::Object(r))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::judge::tests::Scripted;

    fn fc(call_id: &str, name: &str, args: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
            "name": name, "arguments": args, "status": "completed"})
    }

    fn response(output: Value) -> Value {
        json!({"id": "resp_1", "object": "response", "status": "completed", "model": "m",
            "output": output})
    }

    #[test]
    fn a_partly_refused_response_keeps_its_other_calls() {
        let mut body = response(json!([
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            fc("c1", "read", "{\"path\":\"a\"}"),
            fc("c2", "bash", "{}")]));
        let upstream = body.clone();
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        assert!(matches!(rewrite(&mut body, &mut j), Rewritten::Judged(_)));
        let output = body["output"].as_array().unwrap();
        assert_eq!(output.len(), 2);
        assert_eq!(output[1]["call_id"], "c1");
        assert_eq!(j.seen[0].0, "Looking.");
        assert_eq!(j.seen[0].1[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(withheld(&upstream, &body), ["c2"]);
        assert_eq!(body["loopguard"]["interventions"][0]["action"], "block");
    }

    #[test]
    fn a_fully_refused_response_ends_with_the_note() {
        let mut body = response(json!([fc("c1", "bash", "{}")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        rewrite(&mut body, &mut j);
        let output = body["output"].as_array().unwrap();
        assert_eq!(output.len(), 1);
        assert_eq!(output[0]["type"], "message");
        assert_eq!(output[0]["content"][0]["text"], "[loopguard] Refused");
    }

    #[test]
    fn untouched_responses_are_unchanged_and_a_stop_is_an_error() {
        let body = response(json!([fc("c1", "read", "{}")]));
        let mut out = body.clone();
        rewrite(&mut out, &mut Scripted::default());
        assert_eq!(out, body);
        let mut j = Scripted {
            stop: vec!["read"],
            ..Scripted::default()
        };
        assert!(matches!(rewrite(&mut out, &mut j), Rewritten::Stop(_)));
    }

    #[test]
    fn a_retry_continues_the_stored_answer_or_appends_it() {
        let call = call_of(&fc("c1", "bash", "{}"));
        let answer = response(json!([
            {"type": "reasoning", "id": "rs_1", "summary": []},
            fc("c1", "bash", "{}")]));
        let request = json!({"model": "m", "input": "build", "instructions": "be brief"});
        let stored_retry = retry(&request, &answer, &call, "failed").unwrap();
        assert_eq!(stored_retry["previous_response_id"], "resp_1");
        assert_eq!(stored_retry["input"][0]["type"], "function_call_output");
        assert_eq!(stored_retry["instructions"], "be brief");
        let unstored = json!({"model": "m", "input": "build", "store": false});
        let again = retry(&unstored, &answer, &call, "failed").unwrap();
        let input = again["input"].as_array().unwrap();
        assert_eq!(input.len(), 3, "{input:?}");
        assert_eq!(input[1]["call_id"], "c1");
        assert_eq!(input[2]["output"], "failed");
    }

    // --- streams

    fn ev(data: Value) -> String {
        let name = data["type"].as_str().unwrap().to_owned();
        sse::event(&name, &data)
    }

    #[test]
    fn arguments_of_done_events_and_many_empty_items_are_bounded() {
        // Arguments given whole by `.done` events count like arguments in deltas.
        let args = "x".repeat(1 << 20);
        let mut s = Stream::new(Scripted::default());
        for i in 0..20u64 {
            let id = format!("c{i}");
            s.push(ev(json!({"type": "response.output_item.added", "output_index": i,
                "item": {"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": "bash", "arguments": ""}})).as_bytes());
            s.push(ev(json!({"type": "response.function_call_arguments.done", "output_index": i, "arguments": args})).as_bytes());
        }
        assert!(s.state.closed && s.state.malformed);
        assert!(s.items.len() <= 16, "{}", s.items.len());
        // So do empty items, however few bytes they hold.
        let mut s = Stream::new(Scripted::default());
        for i in 0..200_000u64 {
            s.push(
                ev(json!({"type": "response.output_item.added", "output_index": i, "item": {}}))
                    .as_bytes(),
            );
            if s.state.closed {
                break;
            }
        }
        assert!(s.state.closed && s.state.malformed);
        assert!(
            s.items.len() <= MAX_BUFFERED / ENTRY_COST,
            "{}",
            s.items.len()
        );
    }

    fn upstream() -> String {
        let msg = json!({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]});
        let mut out = vec![
            ev(
                json!({"type": "response.created", "sequence_number": 0, "response": response(json!([]))}),
            ),
            ev(
                json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
            ),
            ev(
                json!({"type": "response.output_text.delta", "sequence_number": 2, "output_index": 0, "content_index": 0, "item_id": "msg_1", "delta": "Looking."}),
            ),
            ev(
                json!({"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": msg}),
            ),
        ];
        let mut seq = 4;
        for (i, (id, name, parts)) in [
            ("c1", "read", ["{\"pa", "th\":\"a\"}"]),
            ("c2", "bash", ["{\"comm", "and\":\"ls\"}"]),
        ]
        .iter()
        .enumerate()
        {
            let idx = i + 1;
            let args = parts.concat();
            out.push(ev(
                json!({"type": "response.output_item.added", "sequence_number": seq, "output_index": idx,
                    "item": {"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": name, "arguments": "", "status": "in_progress"}}),
            ));
            seq += 1;
            for p in parts {
                out.push(ev(
                    json!({"type": "response.function_call_arguments.delta", "sequence_number": seq, "output_index": idx, "item_id": format!("fc_{id}"), "delta": p}),
                ));
                seq += 1;
            }
            out.push(ev(
                json!({"type": "response.function_call_arguments.done", "sequence_number": seq, "output_index": idx, "item_id": format!("fc_{id}"), "arguments": args}),
            ));
            seq += 1;
            out.push(ev(
                json!({"type": "response.output_item.done", "sequence_number": seq, "output_index": idx, "item": fc(id, name, &args)}),
            ));
            seq += 1;
        }
        out.push(ev(
            json!({"type": "response.completed", "sequence_number": seq, "response": response(json!([
                msg, fc("c1", "read", "{\"path\":\"a\"}"), fc("c2", "bash", "{\"command\":\"ls\"}")]))}),
        ));
        out.concat()
    }

    fn run(j: Scripted, input: &str, step: usize) -> (Vec<Value>, Stream<Scripted>) {
        let mut s = Stream::new(j);
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(step) {
            out.extend(s.push(piece));
        }
        out.extend(s.finish());
        let mut split = sse::Splitter::default();
        let mut evs = Vec::new();
        split.push(out.concat().as_bytes(), &mut evs).unwrap();
        split.finish(&mut evs);
        let data = evs
            .into_iter()
            .map(|e| serde_json::from_str(&e.data.unwrap()).unwrap())
            .collect();
        (data, s)
    }

    #[test]
    fn calls_are_assembled_judged_and_released_whole() {
        for step in [1, 11, 100, 100_000] {
            let (evs, s) = run(Scripted::default(), &upstream(), step);
            assert_eq!(s.judge.seen.len(), 1);
            let (text, calls) = &s.judge.seen[0];
            assert_eq!(text, "Looking.");
            assert_eq!(calls[0].id, "c1");
            assert_eq!(calls[0].arguments, "{\"path\":\"a\"}");
            assert_eq!(calls[1].arguments, "{\"command\":\"ls\"}");
            let seqs: Vec<u64> = evs
                .iter()
                .map(|e| e["sequence_number"].as_u64().unwrap())
                .collect();
            assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "dense");
            let done: Vec<&Value> = evs
                .iter()
                .filter(|e| e["type"] == "response.output_item.done")
                .collect();
            assert_eq!(done.len(), 3);
            assert_eq!(done[1]["item"]["call_id"], "c1");
            assert_eq!(done[1]["output_index"], 1);
            let last = evs.last().unwrap();
            assert_eq!(last["type"], "response.completed");
            assert_eq!(last["response"]["output"].as_array().unwrap().len(), 3);
        }
    }

    /// Regression: a streamed response was judged without its id, so the proxy neither knew
    /// the session of a request continuing it nor answered the calls it withheld from it.
    #[test]
    fn a_streamed_response_tells_the_judge_its_id() {
        let (_, s) = run(Scripted::default(), &upstream(), 64);
        assert_eq!(s.judge.response_ids, ["resp_1"]);
        let mut body = response(json!([fc("c1", "bash", "{}")]));
        let mut j = Scripted::default();
        rewrite(&mut body, &mut j);
        assert_eq!(j.response_ids, ["resp_1"]);
    }

    #[test]
    fn a_refused_call_leaves_no_trace_and_indices_stay_dense() {
        let j = Scripted {
            block: vec!["read"],
            ..Scripted::default()
        };
        let (evs, _) = run(j, &upstream(), 17);
        assert!(
            evs.iter()
                .all(|e| e["item"]["call_id"] != "c1" && e["item_id"] != "fc_c1"),
            "{evs:?}"
        );
        let indices: Vec<u64> = evs
            .iter()
            .filter(|e| e["type"] == "response.output_item.added")
            .map(|e| e["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(indices, [0, 1]);
        let last = evs.last().unwrap();
        assert_eq!(
            last["response"]["loopguard"]["interventions"][0]["tool_call_id"],
            "c1"
        );
        assert_eq!(last["response"]["output"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn all_refused_ends_with_a_note_item() {
        let j = Scripted {
            block: vec!["read", "bash"],
            ..Scripted::default()
        };
        let (evs, _) = run(j, &upstream(), 29);
        let delta = evs
            .iter()
            .rfind(|e| e["type"] == "response.output_text.delta")
            .unwrap();
        assert_eq!(delta["delta"], "[loopguard] Refused");
        let output = &evs.last().unwrap()["response"]["output"];
        assert_eq!(output[1]["content"][0]["text"], "[loopguard] Refused");
    }

    #[test]
    fn terminate_is_an_error_event_clients_raise_on() {
        let j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let (evs, s) = run(j, &upstream(), 23);
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "error");
        assert_eq!(last["code"], "tool_loop_terminated");
        assert_eq!(last["error"]["code"], "tool_loop_terminated");
        assert!(evs.iter().all(|e| e["type"] != "response.completed"));
        assert!(s.state().terminated.is_some());
    }

    #[test]
    fn a_stream_cut_short_still_judges_and_garbage_is_malformed() {
        let all = upstream();
        let cut = all.find("event: response.completed").unwrap();
        let (evs, s) = run(Scripted::default(), &all[..cut], 64);
        assert_eq!(s.judge.seen[0].1.len(), 2);
        assert!(serde_json::to_string(&evs).unwrap().contains("\"c2\""));
        let mut s = Stream::new(Scripted::default());
        let out = s.push(b"event: x\ndata: [1,\n\n");
        assert!(s.state().malformed);
        assert!(out[0].contains("upstream_malformed"));
    }

    #[test]
    fn a_reply_is_a_valid_response_plain_and_streamed() {
        let plain: Value = serde_json::from_str(&reply("hi", "m", 1, false)).unwrap();
        assert_eq!(plain["output"][0]["content"][0]["text"], "hi");
        let (evs, _) = run(Scripted::default(), &reply("hi", "m", 1, true), 1000);
        assert_eq!(evs.last().unwrap()["type"], "response.completed");
    }
}
