//! Enforcement on a streamed (SSE) chat completion.
//!
//! The algorithm, per choice of the stream:
//!
//! 1. Events are split at blank lines; events with no `data:` (comments, keep-alives) pass
//!    through untouched.
//! 2. A chunk's text (`delta.content`, reasoning, role) passes through at once. Its
//!    `delta.tool_calls` fragments are taken out and assembled per call `index` (id, name,
//!    arguments concatenated); a chunk left with nothing else is dropped.
//! 3. When the choice's `finish_reason` arrives (or `[DONE]`, or the end of the stream), the turn
//!    is judged: text first, then each call in order. Released calls are sent as one chunk each,
//!    whole, renumbered `0, 1, …` so the client's indices stay dense; then the finishing chunk.
//!    A turn whose calls were all withheld gets the refusal as a content delta and
//!    `finish_reason: "stop"`.
//! 4. A terminate verdict ends the stream with a final `data: {"error": …}` event (no `[DONE]`).
//!
//! A call is therefore never released before it was judged, and unreleased calls leave no
//! trace in the client's stream.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::judge::{CallIn, Judge, Judged};

/// Largest single SSE event, and largest total of buffered tool-call text, accepted.
pub const MAX_BUFFERED: usize = 16 << 20;

/// Most of a turn's plain text kept for judging (every choice together). Text passes to the
/// client at once whatever its length; beyond this much, the rest of the turn is not judged
/// (the engine scans at most `chanting.max_message_chars` characters of a message anyway).
pub const MAX_TEXT: usize = 16 << 20;

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

/// The stream rewriter: bytes in, SSE events out.
#[derive(Debug)]
pub struct StreamJudge<J> {
    judge: J,
    line: Vec<u8>,
    event: Vec<String>,
    event_bytes: usize,
    choices: BTreeMap<u64, ChoiceBuf>,
    buffered: usize,
    /// Plain text kept for judging, every choice together (at most [`MAX_TEXT`]).
    text_bytes: usize,
    /// The error a terminate verdict ended the stream with (also sent as its last event).
    pub terminated: Option<ApiError>,
    /// Something the client must see has been emitted: text, a released call, a finish.
    pub committed: bool,
    envelope: Map<String, Value>,
    closed: bool,
    /// The upstream sent an error event of its own.
    pub upstream_error: bool,
    /// The upstream sent something that is not a chat-completion stream.
    pub malformed: bool,
}

impl<J: Judge> StreamJudge<J> {
    pub fn new(judge: J) -> StreamJudge<J> {
        StreamJudge {
            judge,
            line: Vec::new(),
            event: Vec::new(),
            event_bytes: 0,
            choices: BTreeMap::new(),
            buffered: 0,
            text_bytes: 0,
            terminated: None,
            committed: false,
            envelope: Map::new(),
            closed: false,
            upstream_error: false,
            malformed: false,
        }
    }

    /// The stream ended (terminated, or failed): send nothing more.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Feeds bytes from the upstream; returns the events to send to the client.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.closed {
                break;
            }
            if b != b'\n' {
                self.line.push(b);
                if self.line.len() + self.event_bytes > MAX_BUFFERED {
                    self.fail(&mut out, "an SSE event larger than 16 MiB");
                }
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                let lines = std::mem::take(&mut self.event);
                self.event_bytes = 0;
                if !lines.is_empty() {
                    self.on_event(&lines, &mut out);
                }
            } else {
                self.event_bytes += line.len();
                self.event.push(line);
            }
        }
        out
    }

    /// The upstream stream ended: any unfinished event is processed and every turn not yet
    /// judged is judged (its released calls sent, with no finishing chunk the upstream did not
    /// send either).
    pub fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        if !self.line.is_empty() {
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            self.event.push(line);
        }
        let lines = std::mem::take(&mut self.event);
        if !lines.is_empty() {
            self.on_event(&lines, &mut out);
        }
        self.flush_pending(&mut out);
        out
    }

    /// How many calls were assembled but never judged nor released (for logging a stream that
    /// was cut short).
    pub fn abandon(&mut self) -> usize {
        self.choices
            .values()
            .filter(|c| !c.judged)
            .map(|c| c.calls.len() + usize::from(c.legacy.is_some()))
            .sum()
    }

    fn fail(&mut self, out: &mut Vec<String>, what: &str) {
        self.malformed = true;
        self.closed = true;
        out.push(
            ApiError::upstream(
                StatusCode::BAD_GATEWAY,
                "upstream_malformed",
                format!("the upstream stream is malformed: {what}"),
            )
            .sse_event(),
        );
    }

    fn on_event(&mut self, lines: &[String], out: &mut Vec<String>) {
        let raw = format!("{}\n\n", lines.join("\n"));
        let data: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            out.push(raw);
            return;
        }
        let data = data.join("\n");
        if data.trim() == "[DONE]" {
            self.flush_pending(out);
            if !self.closed {
                out.push(raw);
            }
            return;
        }
        let chunk: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(e) => {
                self.fail(out, &format!("an event is not JSON ({e})"));
                return;
            }
        };
        let Value::Object(mut chunk) = chunk else {
            self.fail(out, "an event is not a JSON object");
            return;
        };
        if chunk.contains_key("error") {
            self.upstream_error = true;
            out.push(raw);
            return;
        }
        let Some(Value::Array(choices)) = chunk.remove("choices") else {
            // No choices (a usage-only chunk has an empty array; this has none at all).
            out.push(raw);
            return;
        };
        self.envelope = chunk.clone();
        self.envelope.remove("usage");
        let mut modified = false;
        let mut pre = Vec::new();
        let mut kept = Vec::with_capacity(choices.len());
        let had_choices = !choices.is_empty();
        for mut choice in choices {
            let idx = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let stripped = self.take_calls(idx, &mut choice);
            if stripped && self.buffered > MAX_BUFFERED {
                self.fail(out, "tool-call arguments larger than 16 MiB");
                return;
            }
            modified |= stripped;
            let finishing = choice.get("finish_reason").is_some_and(|f| !f.is_null());
            if finishing {
                let judged = self.judge_choice(idx);
                if let Some(e) = judged.terminate {
                    self.closed = true;
                    out.extend(pre);
                    out.push(e.sse_event());
                    self.terminated = Some(e);
                    return;
                }
                let (events, stop) = self.release(idx, &judged);
                self.committed |= !events.is_empty();
                modified |= !events.is_empty();
                // What the proxy did comes first, then what it let through.
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
        self.committed |= kept.iter().any(substantive);
        if !modified {
            out.push(raw);
            return;
        }
        out.extend(pre);
        if kept.is_empty() && had_choices && chunk.get("usage").is_none_or(Value::is_null) {
            return;
        }
        chunk.insert("choices".into(), Value::Array(kept));
        out.push(format!("data: {}\n\n", Value::Object(chunk)));
    }

    /// Moves a choice's tool-call fragments into its buffer; true when there were any.
    fn take_calls(&mut self, idx: u64, choice: &mut Value) -> bool {
        let Some(Value::Object(delta)) = choice.get_mut("delta") else {
            return false;
        };
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
        self.judge.judge(&text, &calls)
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
            let delta = if i < n_tools {
                let c = tools[i];
                let d = json!({"tool_calls": [{
                    "index": k,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }]});
                k += 1;
                d
            } else if let Some(c) = &buf.legacy {
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
    /// field, as in a plain response).
    fn interventions_event(&self, judged: &Judged) -> String {
        let mut chunk = self.envelope.clone();
        chunk.insert("choices".into(), json!([]));
        chunk.insert(
            "loopguard".into(),
            crate::judge::body_field(&judged.interventions),
        );
        format!("data: {}\n\n", Value::Object(chunk))
    }

    fn synth(&self, idx: u64, delta: Value) -> String {
        let mut chunk = self.envelope.clone();
        chunk.insert(
            "choices".into(),
            json!([{"index": idx, "delta": delta, "finish_reason": null}]),
        );
        format!("data: {}\n\n", Value::Object(chunk))
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
                self.closed = true;
                out.push(e.sse_event());
                self.terminated = Some(e);
                return;
            }
            let (events, _) = self.release(idx, &judged);
            self.committed |= !events.is_empty();
            if !judged.interventions.is_empty() {
                out.push(self.interventions_event(&judged));
            }
            out.extend(events);
        }
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
    use super::*;
    use crate::judge::tests::Scripted;

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
    fn run(j: Scripted, input: &str, step: usize) -> (Vec<String>, Scripted) {
        let mut s = StreamJudge::new(j);
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(step) {
            out.extend(s.push(piece));
        }
        out.extend(s.finish());
        (out, s.judge)
    }

    #[test]
    fn plain_text_kept_for_judging_is_bounded_and_all_of_it_reaches_the_client() {
        // 20 MiB of text in 64 KiB deltas (multi-byte characters at the cut): the client gets
        // every byte, the judge at most MAX_TEXT of it, cut on a character boundary.
        let piece = "é".repeat(32 * 1024);
        let mut s = StreamJudge::new(Scripted::default());
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
    fn fragments_are_assembled_and_judged_once_whole() {
        for step in [1, 7, 64, 4096] {
            let (out, j) = run(Scripted::default(), &upstream(), step);
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
        }
    }

    #[test]
    fn text_passes_before_the_turn_ends() {
        let mut s = StreamJudge::new(Scripted::default());
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
        let (out, _) = run(j, &upstream(), 3);
        let last = out.last().unwrap();
        assert!(last.starts_with("data: {\"error\":"), "{last}");
        assert!(!out.iter().any(|e| e.contains("[DONE]")));
        assert!(!out.iter().any(|e| e.contains("call_a")));
    }

    #[test]
    fn a_stream_cut_short_still_judges_its_calls() {
        let input = [
            chunk(frag(0, Some("c9"), Some("read"), "{\"p\":"), None),
            chunk(frag(0, None, None, "1}"), None),
        ]
        .concat();
        let (out, j) = run(Scripted::default(), &input, 9);
        assert_eq!(j.seen[0].1[0].arguments, "{\"p\":1}");
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
        let mut s = StreamJudge::new(Scripted::default());
        let out = s.push(b"data: {not json\n\n");
        assert!(s.malformed && s.is_closed());
        assert!(out[0].contains("upstream_malformed"));
        assert!(s.push(b"data: {}\n\n").is_empty());
    }

    #[test]
    fn upstream_error_events_pass_and_are_noted() {
        let mut s = StreamJudge::new(Scripted::default());
        let out = s.push(b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n");
        assert!(s.upstream_error);
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
        let (out, j) = run(Scripted::default(), &input, 4);
        assert_eq!(j.seen, vec![("Hello".to_owned(), Vec::new())]);
        assert_eq!(out, split_events(&input));
    }

    fn split_events(s: &str) -> Vec<String> {
        s.split_inclusive("\n\n").map(str::to_owned).collect()
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
            let (_, _) = run(Scripted::default(), input, 3);
        }
    }
}
