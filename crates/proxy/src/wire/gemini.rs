//! Google Gemini `generateContent` (`POST /v1beta/models/{model}:generateContent`, and
//! `:streamGenerateContent`, streamed with `?alt=sse`).
//!
//! The conversation is `contents` (+ `systemInstruction`): `user` and `model` contents of
//! `parts`. Calls are `functionCall` parts (`{name, args, id?}`) of a `model` content; results
//! are `functionResponse` parts (`{name, response, id?}`) of the next `user` content (text
//! beside them is the host's). The model and the method are in the path, not the body; the
//! client's `x-goog-api-key` header or `key` query parameter go to the upstream as they came.
//!
//! Calls and results pair by `id` when they carry one, else by name and order, as Gemini pairs
//! them. A call without an `id` is known to the proxy as `gemini_{turn}_{name}_{k}`: the `k`-th
//! call of that name in the `turn`-th model answer of the conversation (a run of consecutive
//! `model` contents is one answer, as a streamed answer may be kept in pieces), so the call the
//! proxy judged in a response and the call the client sends back in its history have the same
//! id. (A withheld call before another of the same name in one answer shifts that one's `k`:
//! its result is then paired with the withheld call's id, which only matters for a nudge
//! anchored to it.) Reading the conversation into events is the transcript reader's, on
//! contents given these ids, so a conversation is read live as `loopctl simulate` reads it.
//!
//! A whole response: the first candidate's text parts and `functionCall` parts are judged
//! (other candidates pass as they are); withheld `functionCall` parts leave its `parts`, and a
//! candidate left with none gets the note as a text part and `finishReason: "STOP"`. What the
//! proxy did is the response's `loopguard` field. A `streamGenerateContent` answer without
//! `alt=sse` (a JSON array of responses) is read whole and judged as one answer, then passed on
//! as an array (the client gets it at once rather than piece by piece).
//!
//! A stream (`alt=sse`: `data: {GenerateContentResponse}` events, each a piece of the answer):
//!
//! 1. An event without a `functionCall` part passes through as it came. A `functionCall` part
//!    (which Gemini sends whole in one event) is taken out of its event and held; an event
//!    left with no part and no finish reason is not sent.
//! 2. At the event whose first candidate has a `finishReason`, or at the end of the stream, the
//!    answer is judged: text first, then each call in order. The released calls are added to
//!    that event's parts as they came; an answer whose calls were all withheld gets the refusal
//!    as a text part and `finishReason: "STOP"`. The event carries the `loopguard` field.
//! 3. A terminate verdict ends the stream with an error event (`data: {"error": {…}}`).

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value, json};

use super::{ENTRY_COST, NudgePlacement, Rewriter, Rewritten, Seen, StreamState, Wire};
use crate::body::Messages;
use crate::judge::{CallIn, Judge, Judged, body_field};
use crate::sse;

/// Most of an answer's text kept for judging (the client gets all of it).
const MAX_TEXT: usize = 16 << 20;
/// Largest total of held calls and parts accepted (each counts [`ENTRY_COST`] besides its
/// text).
const MAX_BUFFERED: usize = 16 << 20;

/// A part's `functionCall` (or the SDKs' `function_call`).
fn call_of_part(p: &Value) -> Option<&Value> {
    p.get("functionCall")
        .or_else(|| p.get("function_call"))
        .filter(|v| v.is_object())
}

/// A part's `functionResponse` (or `function_response`).
fn response_of_part(p: &Value) -> Option<&Value> {
    p.get("functionResponse")
        .or_else(|| p.get("function_response"))
        .filter(|v| v.is_object())
}

fn parts(content: &Value) -> &[Value] {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn str_field<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// Whether a content holds function responses.
pub fn has_results(m: &Value) -> bool {
    parts(m).iter().any(|p| response_of_part(p).is_some())
}

/// Whether a content calls a function.
pub fn has_calls(m: &Value) -> bool {
    parts(m).iter().any(|p| call_of_part(p).is_some())
}

/// How the proxy sees content `i`: `model` is the assistant's; a `user` content (or one
/// without a role) holding function responses is results, else a person's.
pub fn seen(msgs: &mut Messages<'_>, i: usize) -> Seen {
    let role = msgs.peek(i).role.clone();
    match role.as_deref() {
        Some("model") => Seen::Assistant,
        None | Some("user" | "function" | "tool") => {
            let maybe = msgs
                .raw(i)
                .is_none_or(|r| r.contains("unctionResponse") || r.contains("unction_response"));
            if maybe && msgs.get(i).is_some_and(has_results) {
                Seen::Results
            } else if role.as_deref().is_none_or(|r| r == "user") {
                Seen::Person
            } else {
                Seen::Other
            }
        }
        _ => Seen::Other,
    }
}

/// The id the proxy knows a call without one by: the `k`-th call named `name` of the
/// conversation's `turn`-th model answer (both from 0).
pub fn synthetic_id(turn: u64, name: &str, k: usize) -> String {
    format!("gemini_{turn}_{name}_{k}")
}

/// `contents` with an `id` in every `functionCall` (its own, else [`synthetic_id`]) and in
/// every `functionResponse` that answers one (its own, else the oldest unanswered call of its
/// name). `first_turn` is the number of model answers before the first content.
pub fn with_ids(contents: &[Value], first_turn: u64) -> Vec<Value> {
    let mut out = contents.to_vec();
    let mut turn = first_turn;
    let mut in_answer = false;
    let mut seen_names: HashMap<String, usize> = HashMap::new();
    let mut open: HashMap<String, VecDeque<String>> = HashMap::new();
    for c in &mut out {
        let model = str_field(c, "role") == Some("model");
        if model && !in_answer {
            seen_names.clear();
        }
        if !model && in_answer {
            turn += 1;
        }
        in_answer = model;
        let Some(Value::Array(ps)) = c.get_mut("parts") else {
            continue;
        };
        for p in ps {
            let Some(obj) = p.as_object_mut() else {
                continue;
            };
            let key = [
                "functionCall",
                "function_call",
                "functionResponse",
                "function_response",
            ]
            .into_iter()
            .find(|k| obj.get(*k).is_some_and(Value::is_object));
            let Some(key) = key else { continue };
            let Some(Value::Object(inner)) = obj.get_mut(key) else {
                continue;
            };
            let name = inner
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let id = inner.get("id").and_then(Value::as_str).map(str::to_owned);
            if key == "functionCall" || key == "function_call" {
                let id = id.unwrap_or_else(|| {
                    let k = seen_names.entry(name.clone()).or_default();
                    *k += 1;
                    synthetic_id(turn, &name, *k - 1)
                });
                inner.insert("id".into(), Value::String(id.clone()));
                open.entry(name).or_default().push_back(id);
            } else if let Some(id) = id {
                if let Some(q) = open.get_mut(&name) {
                    q.retain(|x| *x != id);
                }
            } else if let Some(id) = open.get_mut(&name).and_then(VecDeque::pop_front) {
                inner.insert("id".into(), Value::String(id));
            }
        }
    }
    out
}

/// The contents read into events (each event's `line` is its content's 1-based position), with
/// the ids of [`with_ids`]; `first_turn` as there.
pub fn read(contents: &[Value], first_turn: u64) -> Vec<loopguard_transcript::Item> {
    let ided = with_ids(contents, first_turn);
    let positioned: Vec<(usize, &Value)> =
        ided.iter().enumerate().map(|(i, v)| (i + 1, v)).collect();
    loopguard_transcript::messages::read_gemini_contents(
        &positioned,
        loopguard_transcript::messages::Mode::Lenient,
    )
    .unwrap_or_default()
}

/// How many model answers contents `0..end` hold (a run of `model` contents is one).
fn answers_before(msgs: &mut Messages<'_>, end: usize) -> u64 {
    let mut count = 0;
    let mut previous = false;
    for i in 0..end {
        let model = seen(msgs, i) == Seen::Assistant;
        if model && !previous {
            count += 1;
        }
        previous = model;
    }
    count
}

/// The events of the contents from `tail` on: read with the model answer before them, so that
/// their responses pair with its calls.
pub fn read_tail(msgs: &mut Messages<'_>, tail: usize) -> Vec<loopguard_transcript::Item> {
    let mut start = tail.min(msgs.len());
    while start > 0 && seen(msgs, start - 1) == Seen::Assistant {
        start -= 1;
    }
    let first_turn = answers_before(msgs, start);
    let skip = tail - start;
    read(&msgs.values(start), first_turn)
        .into_iter()
        .filter(|item| item.line > skip)
        .collect()
}

/// The tool name of the call `id` in the conversation.
pub fn call_name(msgs: &mut Messages<'_>, id: &str) -> Option<String> {
    with_ids(&msgs.values(0), 0).iter().find_map(|c| {
        parts(c)
            .iter()
            .filter_map(call_of_part)
            .find(|f| str_field(f, "id") == Some(id))
            .and_then(|f| str_field(f, "name"))
            .map(str::to_owned)
    })
}

/// Appends `note` to a function response's `response`: to its `output`, `result`, `content`
/// or `error` text when it has one, else as its `loopguard` member.
fn append_to_response(fr: &mut Value, note: &str) {
    let Some(obj) = fr.as_object_mut() else {
        return;
    };
    match obj.get_mut("response") {
        Some(Value::Object(r)) => {
            for key in ["output", "result", "content", "error", "loopguard"] {
                if let Some(Value::String(s)) = r.get_mut(key) {
                    s.push_str("\n\n");
                    s.push_str(note);
                    return;
                }
            }
            r.insert("loopguard".into(), Value::String(note.to_owned()));
        }
        Some(Value::String(s)) => {
            s.push_str("\n\n");
            s.push_str(note);
        }
        _ => {
            obj.insert("response".into(), json!({ "loopguard": note }));
        }
    }
}

/// Adds a text part holding `note` to a content.
fn push_text(m: &mut Value, note: &str) {
    let Some(obj) = m.as_object_mut() else {
        return;
    };
    match obj.get_mut("parts") {
        Some(Value::Array(ps)) => ps.push(json!({ "text": note })),
        _ => {
            obj.insert("parts".into(), json!([{ "text": note }]));
        }
    }
}

/// A note of the proxy's own in a conversation: a `user` content (Gemini has no system role
/// inside `contents`).
pub fn note_content(note: &str) -> Value {
    json!({"role": "user", "parts": [{"text": note}]})
}

/// [`super::apply_nudges`] for Gemini: an anchored note goes into the `response` of the
/// function response answering its call (`context`), or as a text part after the responses of
/// that content (`system`: Gemini has no system role inside `contents`); a loose note is a
/// text part of the last content when that is a person's or results, else a content of its
/// own.
pub fn apply_nudges(
    msgs: &mut Messages<'_>,
    anchored: &[(String, String)],
    loose: &[String],
    placement: NudgePlacement,
) -> bool {
    let mut changed = false;
    if !anchored.is_empty() {
        let ided = with_ids(&msgs.values(0), 0);
        for (i, c) in ided.iter().enumerate() {
            if !has_results(c) {
                continue;
            }
            // (part position, note) for each response answering an anchored call.
            let mut found: Vec<(usize, &str)> = Vec::new();
            for (k, p) in parts(c).iter().enumerate() {
                let Some(id) = response_of_part(p).and_then(|r| str_field(r, "id")) else {
                    continue;
                };
                for (a, note) in anchored {
                    if a == id {
                        found.push((k, note));
                    }
                }
            }
            if found.is_empty() {
                continue;
            }
            let Some(m) = msgs.get_mut(i) else { continue };
            changed = true;
            match placement {
                NudgePlacement::Context => {
                    for (k, note) in found {
                        let Some(p) = m
                            .get_mut("parts")
                            .and_then(Value::as_array_mut)
                            .and_then(|ps| ps.get_mut(k))
                        else {
                            continue;
                        };
                        let key = if p.get("functionResponse").is_some() {
                            "functionResponse"
                        } else {
                            "function_response"
                        };
                        if let Some(fr) = p.get_mut(key) {
                            append_to_response(fr, note);
                        }
                    }
                }
                NudgePlacement::System => {
                    let text: Vec<&str> = found.iter().map(|(_, n)| *n).collect();
                    push_text(m, &text.join("\n"));
                }
            }
        }
    }
    if loose.is_empty() {
        return changed;
    }
    let note = loose.join("\n");
    let last = msgs.len().checked_sub(1);
    match last.map(|i| (i, seen(msgs, i))) {
        Some((i, Seen::Person | Seen::Results)) => {
            if let Some(m) = msgs.get_mut(i) {
                push_text(m, &note);
            }
        }
        _ => msgs.push(note_content(&note)),
    }
    true
}

/// A `functionCall` part as a call, its id its own or [`synthetic_id`] (`names` counts the
/// answer's calls of each name so far).
fn call_in(f: &Value, turn: u64, names: &mut HashMap<String, usize>) -> CallIn {
    let name = str_field(f, "name").unwrap_or_default().to_owned();
    let id = match str_field(f, "id") {
        Some(id) => id.to_owned(),
        None => {
            let k = names.entry(name.clone()).or_default();
            *k += 1;
            synthetic_id(turn, &name, *k - 1)
        }
    };
    let arguments = match f.get("args") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    CallIn {
        id,
        name,
        arguments,
    }
}

/// Whether a text part is the model's answer (not its thought).
fn answer_text(p: &Value) -> Option<&str> {
    if p.get("thought").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    str_field(p, "text")
}

/// The first candidate of a response, checked: `Ok(None)` when there is none.
fn first_candidate(chunk: &mut Value) -> Result<Option<&mut Map<String, Value>>, String> {
    let Some(obj) = chunk.as_object_mut() else {
        return Err("a response is not a JSON object".into());
    };
    match obj.get_mut("candidates") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(c)) => match c.first_mut() {
            None => Ok(None),
            Some(Value::Object(c)) => Ok(Some(c)),
            Some(_) => Err("candidates[0] is not a JSON object".into()),
        },
        Some(_) => Err("`candidates` is not an array".into()),
    }
}

/// The parts of a candidate's content, made when absent.
fn candidate_parts(c: &mut Map<String, Value>) -> Option<&mut Vec<Value>> {
    let content = c
        .entry("content")
        .or_insert_with(|| json!({"role": "model", "parts": []}));
    if content.is_null() {
        *content = json!({"role": "model", "parts": []});
    }
    let obj = content.as_object_mut()?;
    let ps = obj.entry("parts").or_insert_with(|| json!([]));
    if ps.is_null() {
        *ps = json!([]);
    }
    ps.as_array_mut()
}

/// Judges a whole response (or the JSON array a `streamGenerateContent` without `alt=sse`
/// answers with, as one answer) and rewrites it.
pub fn rewrite(body: &mut Value, judge: &mut dyn Judge) -> Rewritten {
    let chunks: &mut [Value] = match body {
        Value::Array(chunks) => chunks,
        other => std::slice::from_mut(other),
    };
    let turn = judge.answer_turn();
    let mut names = HashMap::new();
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut any = false;
    for chunk in chunks.iter_mut() {
        let c = match first_candidate(chunk) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => return Rewritten::Malformed(e),
        };
        any = true;
        let Some(content) = c.get("content").filter(|v| !v.is_null()) else {
            continue;
        };
        match content.get("parts") {
            None | Some(Value::Null | Value::Array(_)) => {}
            Some(_) => return Rewritten::Malformed("`content.parts` is not an array".into()),
        }
        for p in parts(content) {
            if let Some(f) = call_of_part(p) {
                calls.push(call_in(f, turn, &mut names));
            } else if let Some(t) = answer_text(p) {
                text.push(t.to_owned());
            }
        }
    }
    if !any {
        // A prompt the upstream blocked, usage alone: no answer to judge.
        return Rewritten::Judged(Vec::new());
    }
    let j = judge.judge(&text.concat(), &calls);
    if let Some(e) = j.terminate {
        return Rewritten::Stop(e);
    }
    let mut k = 0;
    for chunk in chunks.iter_mut() {
        let Ok(Some(c)) = first_candidate(chunk) else {
            continue;
        };
        if let Some(Value::Array(ps)) = c.get_mut("content").and_then(|v| v.get_mut("parts")) {
            ps.retain(|p| {
                if call_of_part(p).is_none() {
                    return true;
                }
                k += 1;
                j.releases(k - 1)
            });
        }
    }
    let last = chunks.iter().rposition(|c| {
        c.get("candidates")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    });
    if j.stop
        && let Some(last) = last
        && let Ok(Some(c)) = first_candidate(&mut chunks[last])
    {
        if let Some(note) = &j.note
            && let Some(ps) = candidate_parts(c)
        {
            ps.push(json!({ "text": note }));
        }
        c.insert("finishReason".into(), json!("STOP"));
    }
    if !j.interventions.is_empty()
        && let Some(obj) = chunks.last_mut().and_then(Value::as_object_mut)
    {
        obj.insert("loopguard".into(), body_field(&j.interventions));
    }
    Rewritten::Judged(j.interventions)
}

/// The proxy's own answer, as a response or a stream of one event.
pub fn reply(text: &str, model: &str, id: u64, stream: bool) -> String {
    let body = json!({
        "candidates": [{
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP",
            "index": 0,
        }],
        "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
        "modelVersion": model,
        "responseId": format!("loopguard_{id}"),
    });
    if stream {
        format!("data: {body}\n\n")
    } else {
        body.to_string()
    }
}

/// The request again with the first answer and a failed `functionResponse` for `call`.
pub fn retry(request: &Value, answer: &Value, call: &CallIn, guidance: &str) -> Option<Value> {
    let chunks: &[Value] = match answer {
        Value::Array(c) => c,
        other => std::slice::from_ref(other),
    };
    let mut answer_parts = Vec::new();
    for chunk in chunks {
        if let Some(content) = chunk
            .get("candidates")
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("content"))
        {
            answer_parts.extend(parts(content).iter().cloned());
        }
    }
    let own_id = answer_parts
        .iter()
        .filter_map(call_of_part)
        .any(|f| str_field(f, "id") == Some(call.id.as_str()));
    let mut response = json!({"name": call.name, "response": {"error": guidance}});
    if own_id {
        response["id"] = json!(call.id);
    }
    let mut body = request.clone();
    let contents = body.get_mut("contents")?.as_array_mut()?;
    contents.push(json!({"role": "model", "parts": answer_parts}));
    contents.push(json!({"role": "user", "parts": [{"functionResponse": response}]}));
    Some(body)
}

/// The stream rewriter of Gemini.
#[derive(Debug)]
pub struct Stream<J> {
    judge: J,
    splitter: sse::Splitter,
    /// The answer's text so far (for judging).
    text: String,
    /// The parts passed through so far, for the assembled answer.
    passed: Vec<Value>,
    /// The `functionCall` parts held, as they came, and as calls.
    held: Vec<(Value, CallIn)>,
    /// Calls of each name so far (for ids).
    names: HashMap<String, usize>,
    buffered: usize,
    judged: bool,
    state: StreamState,
}

impl<J: Judge> Stream<J> {
    /// A rewriter judging with `judge`.
    pub fn new(judge: J) -> Stream<J> {
        Stream {
            judge,
            splitter: sse::Splitter::default(),
            text: String::new(),
            passed: Vec::new(),
            held: Vec::new(),
            names: HashMap::new(),
            buffered: 0,
            judged: false,
            state: StreamState::default(),
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

    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>) {
        let Some(data) = &ev.data else {
            out.push(ev.raw);
            return;
        };
        let Ok(mut d @ Value::Object(_)) = serde_json::from_str::<Value>(data) else {
            self.state
                .fail(Wire::Gemini, out, "an event is not a JSON object");
            return;
        };
        if d.get("error").is_some() {
            self.state.upstream_error = true;
            if self.judge.redact(&mut d) || self.judge.quotes_secret(&ev.raw) {
                out.push(format!("data: {d}\n\n"));
            } else {
                out.push(ev.raw);
            }
            return;
        }
        let turn = self.judge.answer_turn();
        let (took, finished, has_parts) = match first_candidate(&mut d) {
            Err(e) => {
                self.state.fail(Wire::Gemini, out, &e);
                return;
            }
            Ok(None) => (Vec::new(), false, false),
            Ok(Some(c)) => {
                let finished = c
                    .get("finishReason")
                    .or_else(|| c.get("finish_reason"))
                    .is_some_and(|r| !r.is_null());
                let mut took = Vec::new();
                if let Some(Value::Array(ps)) =
                    c.get_mut("content").and_then(|v| v.get_mut("parts"))
                {
                    let mut kept = Vec::with_capacity(ps.len());
                    for p in ps.drain(..) {
                        if call_of_part(&p).is_some() {
                            took.push(p);
                        } else {
                            kept.push(p);
                        }
                    }
                    *ps = kept;
                }
                let has_parts = c.get("content").map(parts).is_some_and(|ps| !ps.is_empty());
                (took, finished, has_parts)
            }
        };
        for p in &took {
            if let Some(f) = call_of_part(p) {
                let call = call_in(f, turn, &mut self.names);
                self.buffered +=
                    ENTRY_COST + call.id.len() + call.name.len() + call.arguments.len();
                self.held.push((p.clone(), call));
            }
        }
        if self.buffered > MAX_BUFFERED {
            self.state
                .fail(Wire::Gemini, out, "function calls larger than 16 MiB");
            return;
        }
        let mut texts = Vec::new();
        if let Ok(Some(c)) = first_candidate(&mut d)
            && let Some(content) = c.get("content")
        {
            for p in parts(content) {
                if let Some(t) = answer_text(p) {
                    texts.push(t.to_owned());
                }
                self.buffered += ENTRY_COST;
                self.passed.push(p.clone());
            }
        }
        for t in &texts {
            self.state.committed |= !t.is_empty();
            self.keep_text(t);
        }
        if !finished || self.judged {
            // Before the finish: what is left of the event. After the answer was judged (a
            // finish reason seen again), nothing more is judged: the event goes as it came.
            if took.is_empty() {
                out.push(ev.raw);
            } else if has_parts {
                out.push(format!("data: {d}\n\n"));
            }
            return;
        }
        let judged = self.judge_answer();
        if let Some(e) = judged.terminate {
            self.state.stop(Wire::Gemini, out, e);
            return;
        }
        let changed = !self.held.is_empty() || !judged.interventions.is_empty();
        self.state.committed = true;
        if !changed {
            out.push(ev.raw);
            return;
        }
        self.release(&mut d, &judged);
        out.push(format!("data: {d}\n\n"));
    }

    fn judge_answer(&mut self) -> Judged {
        if self.judged {
            return Judged::default();
        }
        self.judged = true;
        let calls: Vec<CallIn> = self.held.iter().map(|(_, c)| c.clone()).collect();
        let judged = self.judge.judge(&self.text, &calls);
        self.state
            .interventions
            .extend(judged.interventions.iter().cloned());
        judged
    }

    /// Adds the released calls (and the note, when the answer stops) to `chunk`'s first
    /// candidate, and the `loopguard` field.
    fn release(&mut self, chunk: &mut Value, judged: &Judged) {
        let released: Vec<Value> = judged
            .released
            .iter()
            .filter_map(|&i| self.held.get(i).map(|(p, _)| p.clone()))
            .collect();
        if let Ok(Some(c)) = first_candidate(chunk) {
            if let Some(ps) = candidate_parts(c) {
                ps.extend(released);
                if judged.stop
                    && let Some(note) = &judged.note
                {
                    ps.push(json!({ "text": note }));
                }
            }
            if judged.stop {
                c.insert("finishReason".into(), json!("STOP"));
            }
        }
        if !judged.interventions.is_empty()
            && let Some(obj) = chunk.as_object_mut()
        {
            obj.insert("loopguard".into(), body_field(&judged.interventions));
        }
    }
}

impl<J: Judge> super::Events for Stream<J> {
    const WIRE: Wire = Wire::Gemini;

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
        if self.judged || (self.held.is_empty() && self.text.is_empty()) {
            return;
        }
        let judged = self.judge_answer();
        if let Some(e) = judged.terminate {
            self.state.stop(Wire::Gemini, out, e);
            return;
        }
        if self.held.is_empty() && judged.interventions.is_empty() {
            return;
        }
        let mut chunk =
            json!({"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}]});
        self.release(&mut chunk, &judged);
        self.state.committed = true;
        out.push(format!("data: {chunk}\n\n"));
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
        if self.judged { 0 } else { self.held.len() }
    }

    fn answer(&self) -> Option<Value> {
        let mut ps = self.passed.clone();
        ps.extend(self.held.iter().map(|(p, _)| p.clone()));
        Some(json!({"candidates": [{
            "content": {"role": "model", "parts": ps},
            "finishReason": "STOP",
            "index": 0,
        }]}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::judge::tests::Scripted;

    fn call(name: &str, args: Value) -> Value {
        json!({"functionCall": {"name": name, "args": args}})
    }

    fn response(ps: Value, finish: Option<&str>) -> Value {
        let mut c = json!({"content": {"role": "model", "parts": ps}, "index": 0});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        json!({"candidates": [c], "modelVersion": "gemini-test"})
    }

    #[test]
    fn a_partly_refused_answer_keeps_its_other_calls() {
        let mut body = response(
            json!([{"text": "Let me see."}, call("read", json!({"p": "a"})), call("bash", json!({"command": "make"}))]),
            Some("STOP"),
        );
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        assert!(matches!(rewrite(&mut body, &mut j), Rewritten::Judged(_)));
        let ps = body["candidates"][0]["content"]["parts"]
            .as_array()
            .unwrap();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[1]["functionCall"]["name"], "read");
        assert_eq!(j.seen[0].0, "Let me see.");
        assert_eq!(j.seen[0].1[1].arguments, "{\"command\":\"make\"}");
        assert_eq!(j.seen[0].1[1].id, "gemini_0_bash_0");
        assert_eq!(body["loopguard"]["interventions"][0]["action"], "block");
    }

    #[test]
    fn a_fully_refused_answer_ends_with_the_note_and_a_stop_is_an_error() {
        let mut body = response(json!([call("bash", json!({}))]), Some("STOP"));
        let mut j = Scripted {
            block: vec!["bash"],
            ..Scripted::default()
        };
        rewrite(&mut body, &mut j);
        assert_eq!(
            body["candidates"][0]["content"]["parts"],
            json!([{"text": "[loopguard] Refused"}])
        );
        let mut j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let mut body = response(json!([call("bash", json!({}))]), Some("STOP"));
        assert!(matches!(rewrite(&mut body, &mut j), Rewritten::Stop(_)));
        assert!(matches!(
            rewrite(&mut json!({"candidates": 3}), &mut Scripted::default()),
            Rewritten::Malformed(_)
        ));
    }

    #[test]
    fn ids_pair_by_id_then_by_name_and_order_across_answers() {
        let contents = vec![
            json!({"role": "user", "parts": [{"text": "go"}]}),
            json!({"role": "model", "parts": [call("ls", json!({})), call("ls", json!({"p": 1})), {"functionCall": {"id": "x", "name": "cat"}}]}),
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "ls", "response": {"output": "a"}}},
                {"functionResponse": {"id": "x", "name": "cat", "response": {"output": "c"}}},
                {"functionResponse": {"name": "ls", "response": {"output": "b"}}}]}),
            json!({"role": "model", "parts": [call("ls", json!({}))]}),
            json!({"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {}}}]}),
        ];
        let ided = with_ids(&contents, 0);
        let rid = |i: usize, k: usize| ided[i]["parts"][k]["functionResponse"]["id"].clone();
        assert_eq!(rid(2, 0), "gemini_0_ls_0");
        assert_eq!(rid(2, 1), "x");
        assert_eq!(rid(2, 2), "gemini_0_ls_1");
        assert_eq!(rid(4, 0), "gemini_1_ls_0");
        let items = read(&contents, 0);
        let results: Vec<String> = items
            .iter()
            .filter_map(|i| match &i.kind {
                loopguard_transcript::Kind::Result { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            results,
            ["gemini_0_ls_0", "x", "gemini_0_ls_1", "gemini_1_ls_0"]
        );
    }

    #[test]
    fn a_retry_answers_the_call_with_a_failed_response() {
        let request = json!({"contents": [{"role": "user", "parts": [{"text": "go"}]}]});
        let answer = response(json!([call("bash", json!({}))]), Some("STOP"));
        let c = CallIn {
            id: "gemini_0_bash_0".into(),
            name: "bash".into(),
            arguments: "{}".into(),
        };
        let again = retry(&request, &answer, &c, "failed").unwrap();
        let contents = again["contents"].as_array().unwrap();
        assert_eq!(contents[1]["role"], "model");
        assert_eq!(
            contents[2]["parts"][0]["functionResponse"],
            json!({"name": "bash", "response": {"error": "failed"}})
        );
    }

    fn stream_of(chunks: &[Value]) -> String {
        chunks
            .iter()
            .map(|c| format!("data: {c}\r\n\r\n"))
            .collect()
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

    fn events(out: &[String]) -> Vec<Value> {
        let mut split = sse::Splitter::default();
        let mut evs = Vec::new();
        split.push(out.concat().as_bytes(), &mut evs).unwrap();
        split.finish(&mut evs);
        evs.into_iter()
            .map(|e| serde_json::from_str(&e.data.unwrap()).unwrap())
            .collect()
    }

    fn upstream() -> String {
        stream_of(&[
            response(json!([{"text": "Let me "}]), None),
            response(json!([{"text": "look."}]), None),
            response(json!([call("read", json!({"path": "a"}))]), None),
            response(
                json!([call("bash", json!({"command": "ls"}))]),
                Some("STOP"),
            ),
        ])
    }

    #[test]
    fn calls_are_held_judged_and_released_in_the_last_event() {
        for step in [1, 7, 100, 10_000] {
            let (out, s) = run(Scripted::default(), &upstream(), step);
            assert_eq!(s.judge.seen.len(), 1);
            assert_eq!(s.judge.seen[0].0, "Let me look.");
            assert_eq!(s.judge.seen[0].1.len(), 2);
            let evs = events(&out);
            assert_eq!(evs.len(), 3, "{evs:?}");
            let last = &evs[2]["candidates"][0];
            assert_eq!(last["content"]["parts"][0]["functionCall"]["name"], "read");
            assert_eq!(last["content"]["parts"][1]["functionCall"]["name"], "bash");
            assert_eq!(last["finishReason"], "STOP");
        }
    }

    #[test]
    fn text_passes_as_it_came_and_a_call_waits() {
        let mut s = Stream::new(Scripted::default());
        let all = upstream();
        let first = all.find("\r\n\r\n").unwrap() + 4;
        let out = s.push(&all.as_bytes()[..first]);
        assert_eq!(out.concat().trim_end(), all[..first].trim_end());
        assert!(s.state().committed);
        let third = all.match_indices("\r\n\r\n").nth(2).unwrap().0 + 4;
        let out = s.push(&all.as_bytes()[first..third]);
        assert!(!out.concat().contains("functionCall"), "{out:?}");
    }

    #[test]
    fn refused_calls_leave_no_trace_and_all_refused_ends_with_the_note() {
        let j = Scripted {
            block: vec!["read"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 13);
        assert!(!out.concat().contains("\"read\""));
        let j = Scripted {
            block: vec!["read", "bash"],
            ..Scripted::default()
        };
        let (out, _) = run(j, &upstream(), 13);
        let evs = events(&out);
        let last = evs.last().unwrap();
        assert_eq!(
            last["candidates"][0]["content"]["parts"],
            json!([{"text": "[loopguard] Refused"}])
        );
        assert_eq!(last["loopguard"]["interventions"][0]["action"], "block");
    }

    #[test]
    fn terminate_is_an_error_event_and_the_last() {
        let j = Scripted {
            stop: vec!["bash"],
            ..Scripted::default()
        };
        let (out, s) = run(j, &upstream(), 5);
        let last = events(&out).pop().unwrap();
        assert_eq!(last["error"]["status"], "FAILED_PRECONDITION");
        assert!(s.state().terminated.is_some());
    }

    #[test]
    fn a_stream_cut_short_still_judges_its_calls_and_garbage_is_malformed() {
        let all = upstream();
        let cut = all.match_indices("\r\n\r\n").nth(2).unwrap().0 + 4;
        let (out, s) = run(Scripted::default(), &all[..cut], 64);
        assert_eq!(s.judge.seen[0].1.len(), 1);
        assert!(out.concat().contains("\"read\""));
        let (out, s) = run(Scripted::default(), "data: {nope\n\n", 3);
        assert!(s.state().malformed);
        assert!(out[0].contains("upstream_malformed"));
    }

    #[test]
    fn nudges_reach_the_function_response() {
        let contents = vec![
            json!({"role": "model", "parts": [call("bash", json!({}))]}),
            json!({"role": "user", "parts": [{"functionResponse": {"name": "bash", "response": {"output": "out"}}}]}),
        ];
        let anchored = vec![("gemini_0_bash_0".to_owned(), "[loopguard] stop".to_owned())];
        let mut msgs = Messages::from_values(contents.clone());
        assert!(apply_nudges(
            &mut msgs,
            &anchored,
            &[],
            NudgePlacement::Context
        ));
        let m = msgs.values(0);
        assert_eq!(
            m[1]["parts"][0]["functionResponse"]["response"]["output"],
            "out\n\n[loopguard] stop"
        );
        let mut msgs = Messages::from_values(contents);
        apply_nudges(
            &mut msgs,
            &anchored,
            &["loose".into()],
            NudgePlacement::System,
        );
        let m = msgs.values(0);
        assert_eq!(m[1]["parts"][1], json!({"text": "[loopguard] stop"}));
        assert_eq!(m[1]["parts"][2], json!({"text": "loose"}));
    }
}
