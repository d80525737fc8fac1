//! Anthropic Messages (`POST /v1/messages`).
//!
//! Calls are `tool_use` content blocks of the assistant's message; results are `tool_result`
//! blocks in the next user message (text beside them is the host's). The client's `x-api-key`
//! and `anthropic-version` headers are forwarded as they are.
//!
//! A whole response: the message's text blocks and `tool_use` blocks are judged; withheld
//! `tool_use` blocks leave `content`, and a message left with none gets the note as a text
//! block and `stop_reason: "end_turn"`. What the proxy did is the `loopguard` field.
//!
//! A stream (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`, `ping`):
//!
//! 1. Text and thinking blocks pass through at once. A `tool_use` block (its start, its
//!    `input_json_delta` fragments, its stop) is held and assembled.
//! 2. At `message_delta` (which carries the stop reason), or at the end of the stream, the turn
//!    is judged: text first, then each call in order. Released calls are sent as whole blocks
//!    (a start, one `input_json_delta` with the whole input, a stop); a turn whose calls were
//!    all withheld gets the refusal as a text block and `stop_reason: "end_turn"`. Block
//!    indices are renumbered so the client's stay dense and in order. The `message_delta`
//!    carries the `loopguard` field.
//! 3. A terminate verdict ends the stream with an `error` event (no `message_stop`).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{ENTRY_COST, Rewriter, Rewritten, StreamState, Wire};
use crate::judge::{CallIn, Judge, Judged, body_field};
use crate::sse;

/// Most of a turn's text kept for judging (the client gets all of it).
const MAX_TEXT: usize = 16 << 20;
/// Largest total of buffered tool input accepted (each block held counts [`ENTRY_COST`]
/// besides its text).
const MAX_BUFFERED: usize = 16 << 20;

fn blocks(m: &Value) -> &[Value] {
    m.get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// Whether a user message holds tool results.
pub fn has_results(m: &Value) -> bool {
    blocks(m).iter().any(|b| block_type(b) == "tool_result")
}

/// Whether an assistant message calls a tool.
pub fn has_calls(m: &Value) -> bool {
    blocks(m).iter().any(|b| block_type(b) == "tool_use")
}

/// The call ids a user message's `tool_result` blocks answer.
pub fn result_ids(m: &Value) -> Vec<&str> {
    blocks(m)
        .iter()
        .filter(|b| block_type(b) == "tool_result")
        .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
        .collect()
}

/// Appends `note` to the `tool_result` block answering `id`.
pub fn append_to_result(m: &mut Value, id: &str, note: &str) {
    let Some(Value::Array(blocks)) = m.get_mut("content") else {
        return;
    };
    for b in blocks.iter_mut() {
        if block_type(b) != "tool_result"
            || b.get("tool_use_id").and_then(Value::as_str) != Some(id)
        {
            continue;
        }
        if let Some(obj) = b.as_object_mut() {
            match obj.get_mut("content") {
                Some(c) if !c.is_null() => super::append_text(c, note, "text"),
                _ => {
                    obj.insert("content".into(), Value::String(note.to_owned()));
                }
            }
        }
        return;
    }
}

/// A `tool_use` block as a call (its input as JSON text).
fn call_of(b: &Value) -> CallIn {
    let text = |k: &str| {
        b.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    CallIn {
        id: text("id"),
        name: text("name"),
        arguments: match b.get("input") {
            None | Some(Value::Null) => "{}".to_owned(),
            Some(v) => v.to_string(),
        },
    }
}

/// A text block holding `note`.
fn note_block(note: &str) -> Value {
    json!({"type": "text", "text": note})
}

/// Judges a whole message and rewrites it.
pub fn rewrite(body: &mut Value, judge: &mut dyn Judge) -> Rewritten {
    let Some(obj) = body.as_object_mut() else {
        return Rewritten::Malformed("the body is not a JSON object".into());
    };
    let content = match obj.get_mut("content") {
        Some(Value::Array(c)) => c,
        None | Some(Value::Null) => return Rewritten::Judged(Vec::new()),
        Some(_) => return Rewritten::Malformed("`content` is not an array".into()),
    };
    let text: String = content
        .iter()
        .filter(|b| block_type(b) == "text")
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    let calls: Vec<CallIn> = content
        .iter()
        .filter(|b| block_type(b) == "tool_use")
        .map(call_of)
        .collect();
    let j = judge.judge(&text, &calls);
    if let Some(e) = j.terminate {
        return Rewritten::Stop(e);
    }
    let mut k = 0;
    content.retain(|b| {
        if block_type(b) != "tool_use" {
            return true;
        }
        k += 1;
        j.releases(k - 1)
    });
    if j.stop {
        if let Some(note) = &j.note {
            content.push(note_block(note));
        }
        obj.insert("stop_reason".into(), json!("end_turn"));
    }
    if !j.interventions.is_empty() {
        obj.insert("loopguard".into(), body_field(&j.interventions));
    }
    Rewritten::Judged(j.interventions)
}

/// The proxy's own answer, as a message or a stream of its events.
pub fn reply(text: &str, model: &str, id: u64, stream: bool) -> String {
    let id = format!("msg_loopguard_{id}");
    let usage = json!({"input_tokens": 0, "output_tokens": 0});
    if !stream {
        return json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": usage,
        })
        .to_string();
    }
    [
        sse::event(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": usage}}),
        ),
        sse::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        sse::event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ),
        sse::event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        sse::event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 0}}),
        ),
        sse::event("message_stop", &json!({"type": "message_stop"})),
    ]
    .concat()
}

/// The request again with the first answer and a failed `tool_result` for `call`.
pub fn retry(request: &Value, answer: &Value, call: &CallIn, guidance: &str) -> Option<Value> {
    let content = answer.get("content")?.clone();
    let mut body = request.clone();
    let messages = body.get_mut("messages")?.as_array_mut()?;
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": call.id, "content": guidance, "is_error": true,
    }]}));
    Some(body)
}

/// A block of the upstream's stream.
#[derive(Debug)]
enum Block {
    /// Passed through, under the client's index `out`.
    Passed { out: u64 },
    /// A `tool_use` block, held until judged.
    Tool {
        id: String,
        name: String,
        /// The input from the start event (used when no fragment follows).
        start_input: Option<Value>,
        json: String,
    },
}

/// The stream rewriter of Anthropic Messages.
#[derive(Debug)]
pub struct Stream<J> {
    judge: J,
    splitter: sse::Splitter,
    /// Upstream block index → the block.
    blocks: BTreeMap<u64, Block>,
    /// The next block index the client sees.
    next_out: u64,
    text: String,
    buffered: usize,
    judged: bool,
    /// The `message` of `message_start`, for the assembled answer.
    message: Map<String, Value>,
    state: StreamState,
}

impl<J: Judge> Stream<J> {
    /// A rewriter judging with `judge`.
    pub fn new(judge: J) -> Stream<J> {
        Stream {
            judge,
            splitter: sse::Splitter::default(),
            blocks: BTreeMap::new(),
            next_out: 0,
            text: String::new(),
            buffered: 0,
            judged: false,
            message: Map::new(),
            state: StreamState::default(),
        }
    }

    fn calls(&self) -> Vec<CallIn> {
        self.blocks
            .values()
            .filter_map(|b| match b {
                Block::Tool {
                    id,
                    name,
                    start_input,
                    json,
                } => Some(CallIn {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: tool_input(start_input.as_ref(), json),
                }),
                Block::Passed { .. } => None,
            })
            .collect()
    }

    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>) {
        let Some(data) = &ev.data else {
            out.push(ev.raw);
            return;
        };
        let Ok(Value::Object(mut d)) = serde_json::from_str::<Value>(data) else {
            self.state
                .fail(Wire::Messages, out, "an event is not a JSON object");
            return;
        };
        let ty = d
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default()
            .to_owned();
        match ty.as_str() {
            "message_start" => {
                if let Some(Value::Object(m)) = d.get("message") {
                    self.message = m.clone();
                }
                out.push(ev.raw);
            }
            "content_block_start" => {
                let idx = d.get("index").and_then(Value::as_u64).unwrap_or(0);
                let block = d.get("content_block").cloned().unwrap_or(Value::Null);
                self.buffered += ENTRY_COST;
                if block_type(&block) == "tool_use" {
                    let call = call_of(&block);
                    self.buffered += call.id.len() + call.name.len() + call.arguments.len();
                    if self.over_limit(out) {
                        return;
                    }
                    self.blocks.insert(
                        idx,
                        Block::Tool {
                            id: call.id,
                            name: call.name,
                            start_input: block.get("input").cloned(),
                            json: String::new(),
                        },
                    );
                    return;
                }
                if self.over_limit(out) {
                    return;
                }
                if let Some(Value::String(t)) = block.get("text") {
                    self.keep_text(t);
                }
                let o = self.next_out;
                self.next_out += 1;
                self.blocks.insert(idx, Block::Passed { out: o });
                d.insert("index".into(), json!(o));
                out.push(sse::event(&ty, &Value::Object(d)));
            }
            "content_block_delta" | "content_block_stop" => {
                let idx = d.get("index").and_then(Value::as_u64).unwrap_or(0);
                match self.blocks.get_mut(&idx) {
                    Some(Block::Tool { json, .. }) => {
                        if let Some(p) = d
                            .get("delta")
                            .and_then(|x| x.get("partial_json"))
                            .and_then(Value::as_str)
                        {
                            json.push_str(p);
                            self.buffered += p.len();
                            self.over_limit(out);
                        }
                    }
                    Some(Block::Passed { out: o }) => {
                        let o = *o;
                        if let Some(t) = d
                            .get("delta")
                            .and_then(|x| x.get("text"))
                            .and_then(Value::as_str)
                        {
                            let t = t.to_owned();
                            self.state.committed |= !t.is_empty();
                            self.keep_text(&t);
                        } else if ty == "content_block_delta" {
                            self.state.committed = true;
                        }
                        d.insert("index".into(), json!(o));
                        out.push(sse::event(&ty, &Value::Object(d)));
                    }
                    None => out.push(ev.raw),
                }
            }
            "message_delta" => {
                let judged = self.judge_turn();
                if let Some(e) = judged.terminate {
                    self.state.stop(Wire::Messages, out, e);
                    return;
                }
                self.release(&judged, out);
                if judged.stop
                    && let Some(Value::Object(delta)) = d.get_mut("delta")
                {
                    delta.insert("stop_reason".into(), json!("end_turn"));
                }
                if !judged.interventions.is_empty() {
                    d.insert("loopguard".into(), body_field(&judged.interventions));
                }
                self.state.committed = true;
                out.push(sse::event(&ty, &Value::Object(d)));
            }
            "error" => {
                self.state.upstream_error = true;
                let mut error = Value::Object(d);
                if self.judge.redact(&mut error) || self.judge.quotes_secret(&ev.raw) {
                    out.push(sse::event(ev.event.as_deref().unwrap_or("error"), &error));
                } else {
                    out.push(ev.raw);
                }
            }
            _ => out.push(ev.raw),
        }
    }

    /// Whether the blocks held are over the limit (the stream then fails).
    fn over_limit(&mut self, out: &mut Vec<String>) -> bool {
        if self.buffered > MAX_BUFFERED {
            self.state
                .fail(Wire::Messages, out, "tool inputs larger than 16 MiB");
            return true;
        }
        false
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
        if self.judged {
            return Judged::default();
        }
        self.judged = true;
        let calls = self.calls();
        let judged = self.judge.judge(&self.text, &calls);
        self.state
            .interventions
            .extend(judged.interventions.iter().cloned());
        judged
    }

    /// Sends the released calls as whole blocks, and the note when the turn stops.
    fn release(&mut self, judged: &Judged, out: &mut Vec<String>) {
        let calls = self.calls();
        for &i in &judged.released {
            let Some(c) = calls.get(i) else { continue };
            let o = self.next_out;
            self.next_out += 1;
            out.push(sse::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": o,
                    "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
            ));
            out.push(sse::event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": o,
                    "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
            ));
            out.push(sse::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": o}),
            ));
            self.state.committed = true;
        }
        if judged.stop
            && let Some(note) = &judged.note
        {
            let o = self.next_out;
            self.next_out += 1;
            out.push(sse::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": o,
                    "content_block": {"type": "text", "text": ""}}),
            ));
            out.push(sse::event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": o,
                    "delta": {"type": "text_delta", "text": note}}),
            ));
            out.push(sse::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": o}),
            ));
            self.state.committed = true;
        }
    }
}

/// A tool block's input as JSON text: the fragments, else the start's input.
fn tool_input(start: Option<&Value>, json: &str) -> String {
    if !json.trim().is_empty() {
        return json.to_owned();
    }
    match start {
        Some(v) if !v.is_null() => v.to_string(),
        _ => "{}".to_owned(),
    }
}

impl<J: Judge> super::Events for Stream<J> {
    const WIRE: Wire = Wire::Messages;

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
        if !self.judged && !self.blocks.is_empty() {
            let judged = self.judge_turn();
            match judged.terminate {
                Some(e) => self.state.stop(Wire::Messages, out, e),
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

    fn abandon(&mut self) -> usize {
        if self.judged {
            return 0;
        }
        self.calls().len()
    }

    fn answer(&self) -> Option<Value> {
        let mut content = Vec::new();
        if !self.text.is_empty() {
            content.push(json!({"type": "text", "text": self.text}));
        }
        for c in self.calls() {
            let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
            content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
        }
        let mut message = self.message.clone();
        message.insert("content".into(), Value::Array(content));
        message.insert("stop_reason".into(), json!("tool_use"));
        Some(Value::Object(message))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::judge::tests::Scripted;

    fn message(content: Value) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": content, "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1}})
    }

    fn tool(id: &str, name: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": {"command": "make"}})
    }

    fn judged(body: &mut Value, j: &mut Scripted) {
        assert!(matches!(rewrite(body, j), Rewritten::Judged(_)));
    }

    #[test]
    fn a_partly_refused_message_keeps_its_other_calls() {
        let mut body = message(json!([
            {"type": "text", "text": "Let me see."}, tool("t1", "read"), tool("t2", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        judged(&mut body, &mut j);
        let content = body["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[1]["id"], "t1");
        assert_eq!(body["stop_reason"], "tool_use");
        assert_eq!(j.seen[0].0, "Let me see.");
        assert_eq!(j.seen[0].1[1].arguments, "{\"command\":\"make\"}");
        assert_eq!(body["loopguard"]["interventions"][0]["tool_call_id"], "t2");
    }

    #[test]
    fn a_fully_refused_message_ends_its_turn_with_the_note() {
        let mut body = message(json!([tool("t1", "bash")]));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        judged(&mut body, &mut j);
        assert_eq!(
            body["content"],
            json!([{"type": "text", "text": "[loopguard] Refused"}])
        );
        assert_eq!(body["stop_reason"], "end_turn");
    }

    #[test]
    fn an_untouched_message_is_unchanged_and_a_stop_is_an_error() {
        let body = message(json!([tool("t1", "read")]));
        let mut out = body.clone();
        judged(&mut out, &mut Scripted::default());
        assert_eq!(out, body);
        let mut j = Scripted {
            stop: vec!["read"],
            ..Scripted::default()
        };
        assert!(matches!(rewrite(&mut out, &mut j), Rewritten::Stop(_)));
        assert!(matches!(
            rewrite(&mut json!({"content": 3}), &mut Scripted::default()),
            Rewritten::Malformed(_)
        ));
    }

    #[test]
    fn results_and_notes_live_in_tool_result_blocks() {
        let mut m = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "out"}]},
            {"type": "tool_result", "tool_use_id": "t2"}]});
        assert!(has_results(&m));
        assert_eq!(result_ids(&m), ["t1", "t2"]);
        append_to_result(&mut m, "t1", "n1");
        append_to_result(&mut m, "t2", "n2");
        assert_eq!(
            m["content"][0]["content"][1],
            json!({"type": "text", "text": "n1"})
        );
        assert_eq!(m["content"][1]["content"], "n2");
    }

    #[test]
    fn a_retry_answers_the_call_with_a_failed_result() {
        let request = json!({"model": "claude", "messages": [{"role": "user", "content": "go"}]});
        let answer = message(json!([tool("t1", "bash")]));
        let again = retry(&request, &answer, &call_of(&tool("t1", "bash")), "failed").unwrap();
        let m = again["messages"].as_array().unwrap();
        assert_eq!(m[1]["content"][0]["id"], "t1");
        assert_eq!(m[2]["content"][0]["is_error"], true);
        assert_eq!(m[2]["content"][0]["tool_use_id"], "t1");
    }

    // --- streams

    fn ev(name: &str, data: Value) -> String {
        sse::event(name, &data)
    }

    /// Text, then two tool blocks whose input arrives in fragments, then the end.
    fn upstream() -> String {
        let mut out = vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "model": "claude", "stop_reason": null,
                "usage": {"input_tokens": 1, "output_tokens": 1}}}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            ev("ping", json!({"type": "ping"})),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
        ];
        for (i, (id, name, parts)) in [
            ("t1", "read", ["{\"pa", "th\":\"a\"}"]),
            ("t2", "bash", ["{\"comm", "and\":\"ls\"}"]),
        ]
        .iter()
        .enumerate()
        {
            let idx = i + 1;
            out.push(ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": idx,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            ));
            for p in parts {
                out.push(ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": idx,
                        "delta": {"type": "input_json_delta", "partial_json": p}}),
                ));
            }
            out.push(ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": idx}),
            ));
        }
        out.push(ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"output_tokens": 9}}),
        ));
        out.push(ev("message_stop", json!({"type": "message_stop"})));
        out.concat()
    }

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
    fn tool_inputs_of_block_starts_and_many_empty_blocks_are_bounded() {
        // Whole inputs in `content_block_start` count like inputs in deltas.
        let input = json!({"command": "x".repeat(1 << 20)});
        let mut s = Stream::new(Scripted::default());
        for i in 0..20u64 {
            let block = json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash", "input": input});
            s.push(
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": block}),
                )
                .as_bytes(),
            );
        }
        assert!(s.state.closed && s.state.malformed);
        assert!(s.blocks.len() <= 16, "{}", s.blocks.len());
        // So do empty blocks, however few bytes they hold.
        let mut s = Stream::new(Scripted::default());
        for i in 0..200_000u64 {
            let block = json!({"type": "text", "text": ""});
            s.push(
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": block}),
                )
                .as_bytes(),
            );
            if s.state.closed {
                break;
            }
        }
        assert!(s.state.closed && s.state.malformed);
        assert!(
            s.blocks.len() <= MAX_BUFFERED / ENTRY_COST,
            "{}",
            s.blocks.len()
        );
    }

    /// Every event as (type, data).
    fn events(out: &[String]) -> Vec<(String, Value)> {
        let mut split = sse::Splitter::default();
        let mut evs = Vec::new();
        split.push(out.concat().as_bytes(), &mut evs).unwrap();
        split.finish(&mut evs);
        evs.into_iter()
            .map(|e| {
                (
                    e.event.unwrap_or_default(),
                    serde_json::from_str(&e.data.unwrap()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn tool_blocks_are_assembled_judged_and_released_whole() {
        for step in [1, 9, 100, 10_000] {
            let (out, s) = run(Scripted::default(), &upstream(), step);
            assert_eq!(s.judge.seen.len(), 1);
            let (text, calls) = &s.judge.seen[0];
            assert_eq!(text, "Let me look.");
            assert_eq!(calls[0].arguments, "{\"path\":\"a\"}");
            assert_eq!(calls[1].id, "t2");
            let evs = events(&out);
            let starts: Vec<&Value> = evs
                .iter()
                .filter(|(n, _)| n == "content_block_start")
                .map(|(_, d)| d)
                .collect();
            assert_eq!(starts.len(), 3);
            assert_eq!(starts[1]["index"], 1);
            assert_eq!(starts[1]["content_block"]["id"], "t1");
            let inputs: Vec<&Value> = evs
                .iter()
                .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
                .map(|(_, d)| &d["delta"]["partial_json"])
                .collect();
            assert_eq!(
                inputs,
                [&json!("{\"path\":\"a\"}"), &json!("{\"command\":\"ls\"}")]
            );
            assert_eq!(evs.last().unwrap().0, "message_stop");
        }
    }

    #[test]
    fn text_passes_at_once_and_a_tool_block_waits() {
        let mut s = Stream::new(Scripted::default());
        let all = upstream();
        let text_end = all.find("event: content_block_stop").unwrap();
        let out = s.push(&all.as_bytes()[..text_end]);
        assert!(out.iter().any(|e| e.contains("Let me ")));
        assert!(s.state().committed);
        let tool_end = all.find("event: message_delta").unwrap();
        let out = s.push(&all.as_bytes()[text_end..tool_end]);
        assert!(!out.iter().any(|e| e.contains("tool_use")), "{out:?}");
    }

    #[test]
    fn a_refused_block_leaves_no_trace_and_indices_stay_dense() {
        let j = Scripted {
            block: vec!["read"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 13);
        let evs = events(&out);
        assert!(
            evs.iter().all(|(_, d)| d["content_block"]["id"] != "t1"),
            "{evs:?}"
        );
        let starts: Vec<u64> = evs
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| d["index"].as_u64().unwrap())
            .collect();
        assert_eq!(starts, [0, 1]);
        let delta = &evs.iter().find(|(n, _)| n == "message_delta").unwrap().1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["loopguard"]["interventions"][0]["action"], "block");
    }

    #[test]
    fn all_refused_ends_the_turn_with_a_text_block() {
        let j = Scripted {
            block: vec!["read", "bash"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 7);
        let evs = events(&out);
        let note = evs
            .iter()
            .rfind(|(_, d)| d["delta"]["type"] == "text_delta")
            .unwrap();
        assert_eq!(note.1["delta"]["text"], "[loopguard] Refused");
        assert_eq!(note.1["index"], 1);
        let delta = &evs.iter().find(|(n, _)| n == "message_delta").unwrap().1;
        assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn terminate_is_an_error_event_and_the_last() {
        let j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let (out, s) = run(j, &upstream(), 5);
        let last = out.last().unwrap();
        assert!(last.starts_with("event: error\n"), "{last}");
        assert!(!out.concat().contains("message_stop"));
        assert!(s.state().terminated.is_some());
    }

    #[test]
    fn a_stream_cut_short_still_judges_its_calls_and_garbage_is_malformed() {
        let all = upstream();
        let cut = all.find("event: message_delta").unwrap();
        let (out, s) = run(Scripted::default(), &all[..cut], 64);
        assert_eq!(s.judge.seen[0].1.len(), 2);
        assert!(out.concat().contains("\"t2\""));
        let (out, s) = run(Scripted::default(), "event: x\ndata: {nope\n\n", 3);
        assert!(s.state().malformed);
        assert!(out[0].contains("upstream_malformed"));
    }

    #[test]
    fn the_assembled_answer_is_a_whole_message() {
        let (_, s) = run(Scripted::default(), &upstream(), 4096);
        let answer = s.answer().unwrap();
        assert_eq!(answer["id"], "msg_1");
        assert_eq!(answer["content"][1]["input"]["path"], "a");
    }

    #[test]
    fn a_reply_is_a_valid_message_plain_and_streamed() {
        let plain: Value = serde_json::from_str(&reply("hi", "claude", 3, false)).unwrap();
        assert_eq!(plain["content"][0]["text"], "hi");
        let streamed = reply("hi", "claude", 3, true);
        let evs = events(&[streamed]);
        assert_eq!(evs.first().unwrap().0, "message_start");
        assert_eq!(evs.last().unwrap().0, "message_stop");
    }
}
