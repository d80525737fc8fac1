//! Gemini `contents`, as Gemini CLI and the google-genai SDKs record a conversation: a list of
//! `{"role": "user" | "model" | "function" | "tool", "parts": [...]}` contents, bare, as JSON
//! Lines, or in a request body `{"contents": [...]}`.
//!
//! Each content is rewritten as the chat messages it stands for and read by the one reader of
//! chat conversations ([`crate::messages`]), so every format means the same thing:
//!
//! - a `model` content is one assistant message: its `thought` text parts are reasoning, its
//!   other text parts (concatenated: they are pieces of one streamed answer) its text, its
//!   `functionCall` parts its calls in order; consecutive `model` contents are one (the pieces
//!   of a streamed answer, which the SDKs' chats keep as a content each), at the line of the
//!   first;
//! - a `functionResponse` part (in a `user`, `function` or `tool` content) is a result, read
//!   before the content's text, which then counts as the host's (as beside any tool result);
//! - a call without an `id` gets a synthetic one (`gemini_call_N`); a response answers the
//!   call its `id` names, else the oldest unanswered call of the same name, else nothing (it
//!   is kept as a result of its own id, like any result that names no call);
//! - `inlineData`, `fileData`, `executableCode` and `codeExecutionResult` parts (code the
//!   server ran) are passed over, as are parts holding only metadata (a `thoughtSignature`);
//!   any other part is an error naming its line.
//!
//! The SDKs' snake_case spellings (`function_call`, `function_response`, `inline_data`, …) are
//! read as well.
//!
//! Recorded `generateContent` responses (`{"candidates": [{"content": {"role": "model",
//! "parts"}}], …}`), alone, after a request's `contents` in one record, or as streamed chunks,
//! become the model contents they add ([`response_contents`]).
//!
//! Gemini CLI's own session files (`{"sessionId", "messages": [{"type": "user" | "gemini",
//! "content", "toolCalls", "thoughts"}]}`) are read by [`read_cli_session`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::{Map, Value, json};

use crate::messages::{Mode, Reader};
use crate::{BadInput, Item, Line};

/// Whether a list element is a Gemini content: an object with `parts` and neither a chat
/// message's `content` nor an item's `type`.
pub(crate) fn is_content(v: &Value) -> bool {
    v.get("parts").is_some() && v.get("content").is_none() && v.get("type").is_none()
}

/// Parts that carry nothing the engine reads: media, and code the server ran.
const SKIPPED_PARTS: &[&str] = &[
    "inlineData",
    "inline_data",
    "fileData",
    "file_data",
    "executableCode",
    "executable_code",
    "codeExecutionResult",
    "code_execution_result",
];

/// Keys a part may carry beside its data; a part with nothing else says nothing.
const PART_METADATA: &[&str] = &[
    "thought",
    "thoughtSignature",
    "thought_signature",
    "videoMetadata",
    "video_metadata",
    "partMetadata",
    "part_metadata",
];

/// Reads Gemini contents, each with its line.
pub(crate) fn read(contents: &[(Line, &Value)]) -> Result<Vec<Item>, BadInput> {
    read_with(contents, Mode::Strict, true)
}

/// Reads the model contents [`response_contents`] made: each is a whole answer (its pieces
/// already joined up to their finish reason), kept apart from the next.
pub(crate) fn read_answers(contents: &[(Line, &Value)]) -> Result<Vec<Item>, BadInput> {
    read_with(contents, Mode::Strict, false)
}

/// Reads Gemini contents, each with its line; in [`Mode::Lenient`] a content that cannot be
/// read is passed over (the others are read as if it were not there). With `join`, consecutive
/// `model` contents are read as one.
pub(crate) fn read_with(
    contents: &[(Line, &Value)],
    mode: Mode,
    join: bool,
) -> Result<Vec<Item>, BadInput> {
    let mut reader = Reader::new(mode);
    let mut calls = Calls::default();
    let contents = if join {
        merge_answers(contents)
    } else {
        contents
            .iter()
            .map(|&(l, v)| (l, Cow::Borrowed(v)))
            .collect()
    };
    for (line, content) in contents {
        let read = match messages(line, &content, &mut calls) {
            Ok(read) => read,
            Err(_) if mode == Mode::Lenient => continue,
            Err(e) => return Err(e),
        };
        for message in read {
            reader.message(line, &message)?;
        }
    }
    Ok(reader.finish())
}

/// Whether a content is a `model` content whose parts can be joined with another's.
fn joinable_answer(v: &Value) -> bool {
    v.get("role").and_then(Value::as_str) == Some("model")
        && matches!(v.get("parts"), None | Some(Value::Null | Value::Array(_)))
        && v.is_object()
}

/// The contents with each run of consecutive `model` contents joined into one, at the line of
/// the first: the pieces of one streamed answer.
fn merge_answers<'a>(contents: &[(Line, &'a Value)]) -> Vec<(Line, Cow<'a, Value>)> {
    let mut out: Vec<(Line, Cow<'a, Value>)> = Vec::new();
    for &(line, content) in contents {
        if joinable_answer(content)
            && let Some((_, previous)) = out.last_mut()
            && joinable_answer(previous)
        {
            let more = content
                .get("parts")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if let Some(obj) = previous.to_mut().as_object_mut() {
                match obj.get_mut("parts") {
                    Some(Value::Array(parts)) => parts.extend(more),
                    _ => {
                        obj.insert("parts".into(), Value::Array(more));
                    }
                }
            }
            continue;
        }
        out.push((line, Cow::Borrowed(content)));
    }
    out
}

/// Calls made and not yet answered: by id, and per tool name oldest first.
#[derive(Default)]
struct Calls {
    /// Unanswered call ids and their tools.
    open: HashMap<String, String>,
    /// Per tool, its calls' ids in order; answered ones are dropped when met.
    by_name: HashMap<String, VecDeque<String>>,
    /// Ids given to calls so far, so a synthetic id never repeats a recorded one.
    used: HashSet<String>,
    synthetic: u64,
}

impl Calls {
    fn fresh_id(&mut self) -> String {
        loop {
            self.synthetic += 1;
            let id = format!("gemini_call_{}", self.synthetic);
            if !self.used.contains(&id) {
                return id;
            }
        }
    }

    fn call(&mut self, id: Option<&str>, name: &str) -> String {
        let id = match id {
            Some(id) if !self.used.contains(id) => id.to_owned(),
            _ => self.fresh_id(),
        };
        self.used.insert(id.clone());
        self.open.insert(id.clone(), name.to_owned());
        self.by_name
            .entry(name.to_owned())
            .or_default()
            .push_back(id.clone());
        id
    }

    /// The id of the call a response answers.
    fn answer(&mut self, id: Option<&str>, name: &str) -> String {
        if let Some(id) = id
            && self.open.remove(id).is_some()
        {
            return id.to_owned();
        }
        if let Some(queue) = self.by_name.get_mut(name) {
            while let Some(id) = queue.pop_front() {
                if self.open.remove(&id).is_some() {
                    return id;
                }
            }
        }
        match id {
            Some(id) => id.to_owned(),
            None => self.fresh_id(),
        }
    }
}

/// The chat messages one content stands for.
fn messages(line: Line, content: &Value, calls: &mut Calls) -> Result<Vec<Value>, BadInput> {
    let Value::Object(obj) = content else {
        return Err(BadInput::at(line, "a Gemini content must be a JSON object"));
    };
    let role = match obj.get("role") {
        // The API's default role.
        None | Some(Value::Null) => "user",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(BadInput::at(line, "`role` must be a string")),
    };
    let model = match role {
        "model" => true,
        "user" | "function" | "tool" => false,
        // A system instruction kept among the contents.
        "system" => return Ok(Vec::new()),
        other => {
            return Err(BadInput::at(
                line,
                format!("unknown role `{other}`; expected user, model, function or tool"),
            ));
        }
    };
    let parts = match obj.get("parts") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(parts)) => parts.as_slice(),
        Some(_) => return Err(BadInput::at(line, "`parts` must be an array")),
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    let mut results = Vec::new();
    for (k, part) in parts.iter().enumerate() {
        let at = |what: &str| BadInput::at(line, format!("parts[{k}]: {what}"));
        let Value::Object(part) = part else {
            return Err(at("a part must be a JSON object"));
        };
        if let Some(t) = part.get("text") {
            let Value::String(t) = t else {
                return Err(at("`text` must be a string"));
            };
            let thought = match part.get("thought") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(at("`thought` must be true or false")),
            };
            if thought { &mut reasoning } else { &mut text }.push_str(t);
        } else if let Some(fc) = either(part, "functionCall", "function_call") {
            if !model {
                return Err(at("a `functionCall` belongs in a `model` content"));
            }
            let (id, name) = id_and_name(fc, "functionCall").map_err(|e| at(&e))?;
            let arguments = match fc.get("args") {
                None | Some(Value::Null) => json!({}),
                Some(v @ (Value::Object(_) | Value::String(_))) => v.clone(),
                Some(_) => return Err(at("`functionCall.args` must be an object")),
            };
            let id = calls.call(id, name);
            tool_calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }));
        } else if let Some(fr) = either(part, "functionResponse", "function_response") {
            if model {
                return Err(at(
                    "a `functionResponse` belongs in a `user` or `function` content",
                ));
            }
            let (id, name) = id_and_name(fr, "functionResponse").map_err(|e| at(&e))?;
            let (output, error) = response_text(fr.get("response").unwrap_or(&Value::Null));
            let id = calls.answer(id, name);
            results.push(json!({
                "role": "tool",
                "tool_call_id": id,
                "content": output,
                "is_error": error,
            }));
        } else if !SKIPPED_PARTS.iter().any(|k| part.contains_key(*k))
            && !part.keys().all(|k| PART_METADATA.contains(&k.as_str()))
        {
            return Err(at(
                "unknown part; expected `text`, `functionCall`, `functionResponse`, `inlineData`, `fileData`, `executableCode` or `codeExecutionResult`",
            ));
        }
    }
    if model {
        let mut m = json!({"role": "assistant", "content": text});
        if !tool_calls.is_empty() {
            m["tool_calls"] = Value::Array(tool_calls);
        }
        if !reasoning.is_empty() {
            m["reasoning"] = Value::String(reasoning);
        }
        return Ok(vec![m]);
    }
    if !text.is_empty() {
        results.push(json!({"role": "user", "content": text}));
    }
    Ok(results)
}

fn either<'a>(part: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    part.get(camel)
        .or_else(|| part.get(snake))
        .filter(|v| !v.is_null())
}

/// A call's or response's optional `id` and required `name`.
fn id_and_name<'a>(v: &'a Value, what: &str) -> Result<(Option<&'a str>, &'a str), String> {
    let Value::Object(obj) = v else {
        return Err(format!("`{what}` must be an object"));
    };
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(format!("`{what}.id` must be a string")),
    };
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{what}.name` must be a string"))?;
    Ok((id, name))
}

/// A function response's text and whether it reports a failure: an `error` field is a
/// failure; a string `output`, `result` or `content` field is the text; any other response
/// is its JSON text.
fn response_text(response: &Value) -> (String, bool) {
    match response {
        Value::Null => (String::new(), false),
        Value::String(s) => (s.clone(), false),
        Value::Object(obj) => {
            if let Some(e) = obj.get("error").filter(|e| !e.is_null()) {
                let text = match e {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                return (text, true);
            }
            for key in ["output", "result", "content"] {
                if let Some(Value::String(s)) = obj.get(key) {
                    return (s.clone(), false);
                }
            }
            (response.to_string(), false)
        }
        other => (other.to_string(), false),
    }
}

// --- generateContent responses -----------------------------------------------------------------

/// Keys of a `generateContent` response besides `candidates`: a streamed chunk may hold only
/// these (the last one's usage, a blocked prompt's feedback).
const RESPONSE_KEYS: &[&str] = &[
    "usageMetadata",
    "usage_metadata",
    "promptFeedback",
    "prompt_feedback",
    "modelVersion",
    "model_version",
    "responseId",
    "response_id",
    "createTime",
    "create_time",
];

/// Whether a value is a `generateContent` response (or one streamed chunk of one): an object
/// with `candidates`.
pub(crate) fn is_response(v: &Value) -> bool {
    v.get("candidates").is_some()
}

/// The model contents a list of `generateContent` responses add to a conversation, each with
/// its line. Only the first candidate is the conversation (the others are alternatives the
/// client did not keep). The parts of successive responses are pieces of one streamed answer
/// (`streamGenerateContent`) until a candidate has a `finishReason`: each such run is one
/// `model` content at the line of its first piece. A response without a candidate or without
/// content (a blocked prompt, a chunk of usage only) adds nothing.
pub(crate) fn response_contents(
    responses: &[(Line, &Value)],
) -> Result<Vec<(Line, Value)>, BadInput> {
    let mut out = Vec::new();
    let mut open: Option<(Line, Vec<Value>)> = None;
    for &(line, response) in responses {
        let Value::Object(obj) = response else {
            return Err(BadInput::at(
                line,
                "a Gemini response must be a JSON object",
            ));
        };
        let candidates = match obj.get("candidates") {
            Some(Value::Array(c)) => c.as_slice(),
            None if obj.keys().any(|k| RESPONSE_KEYS.contains(&k.as_str())) => &[][..],
            None => {
                return Err(BadInput::at(
                    line,
                    "a Gemini response needs `candidates` (or only usage or prompt feedback)",
                ));
            }
            Some(_) => return Err(BadInput::at(line, "`candidates` must be an array")),
        };
        let Some(first) = candidates.first() else {
            continue;
        };
        let Value::Object(candidate) = first else {
            return Err(BadInput::at(line, "candidates[0] must be a JSON object"));
        };
        match candidate.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::Object(content)) => {
                match content.get("role") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(r)) if r == "model" => {}
                    Some(_) => {
                        return Err(BadInput::at(
                            line,
                            "candidates[0].content.role must be `model`",
                        ));
                    }
                }
                let parts = match content.get("parts") {
                    None | Some(Value::Null) => &[][..],
                    Some(Value::Array(parts)) => parts.as_slice(),
                    Some(_) => {
                        return Err(BadInput::at(
                            line,
                            "candidates[0].content.parts must be an array",
                        ));
                    }
                };
                open.get_or_insert_with(|| (line, Vec::new()))
                    .1
                    .extend(parts.iter().cloned());
            }
            Some(_) => {
                return Err(BadInput::at(
                    line,
                    "candidates[0].content must be a JSON object",
                ));
            }
        }
        let finished = candidate
            .get("finishReason")
            .or_else(|| candidate.get("finish_reason"))
            .is_some_and(|r| !r.is_null());
        if finished && let Some((at, parts)) = open.take() {
            out.push((at, json!({"role": "model", "parts": parts})));
        }
    }
    if let Some((at, parts)) = open {
        out.push((at, json!({"role": "model", "parts": parts})));
    }
    Ok(out)
}

// --- Gemini CLI session files -------------------------------------------------------------------

/// Record types of a Gemini CLI session file that are notes of the CLI, not the conversation.
const CLI_NOTES: &[&str] = &["info", "error", "warning"];

/// Whether a list element is a record of a Gemini CLI session file
/// (`~/.gemini/tmp/<project>/chats/session-*.json`: `{"sessionId", "messages": [...]}`): a
/// `type` of `user` or `gemini` (or a note) and no `role`.
pub(crate) fn is_cli_record(v: &Value) -> bool {
    v.get("role").is_none()
        && v.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t == "user" || t == "gemini" || CLI_NOTES.contains(&t))
}

/// Reads the records of a Gemini CLI session file, each with its line: a `user` record is a
/// user message, a `gemini` record an assistant message (its `thoughts` reasoning, its
/// `content` text, its `toolCalls` calls) followed by the results its tool calls recorded
/// (`result`: `functionResponse` parts; `status: "error"` marks a failure); `info`, `error`
/// and `warning` records are the CLI's notes and are skipped.
pub(crate) fn read_cli_session(records: &[(Line, &Value)]) -> Result<Vec<Item>, BadInput> {
    let mut reader = Reader::new(Mode::Strict);
    let mut calls = Calls::default();
    for &(line, record) in records {
        for message in cli_messages(line, record, &mut calls)? {
            reader.message(line, &message)?;
        }
    }
    Ok(reader.finish())
}

fn cli_messages(line: Line, record: &Value, calls: &mut Calls) -> Result<Vec<Value>, BadInput> {
    let Value::Object(obj) = record else {
        return Err(BadInput::at(line, "a session record must be a JSON object"));
    };
    let ty = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        _ => return Err(BadInput::at(line, "a session record needs a string `type`")),
    };
    let text = parts_text(obj.get("content").unwrap_or(&Value::Null))
        .ok_or_else(|| BadInput::at(line, "`content` must be a string or a list of parts"))?;
    match ty {
        "user" => Ok(if text.is_empty() {
            Vec::new()
        } else {
            vec![json!({"role": "user", "content": text})]
        }),
        "gemini" => {
            let mut reasoning = Vec::new();
            match obj.get("thoughts") {
                None | Some(Value::Null) => {}
                Some(Value::Array(thoughts)) => {
                    for t in thoughts {
                        for key in ["subject", "description"] {
                            if let Some(Value::String(s)) = t.get(key) {
                                reasoning.push(s.as_str());
                            }
                        }
                    }
                }
                Some(_) => return Err(BadInput::at(line, "`thoughts` must be an array")),
            }
            let records = match obj.get("toolCalls") {
                None | Some(Value::Null) => &[][..],
                Some(Value::Array(c)) => c.as_slice(),
                Some(_) => return Err(BadInput::at(line, "`toolCalls` must be an array")),
            };
            let mut tool_calls = Vec::new();
            let mut results = Vec::new();
            for (k, call) in records.iter().enumerate() {
                let at = |what: &str| BadInput::at(line, format!("toolCalls[{k}]: {what}"));
                let (id, name) = id_and_name(call, "toolCall").map_err(|e| at(&e))?;
                let arguments = match call.get("args") {
                    None | Some(Value::Null) => json!({}),
                    Some(v @ (Value::Object(_) | Value::String(_))) => v.clone(),
                    Some(_) => return Err(at("`args` must be an object")),
                };
                let id = calls.call(id, name);
                // The record carries its own result: the call is answered here.
                calls.open.remove(&id);
                tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
                let failed = call.get("status").and_then(Value::as_str) == Some("error");
                match call.get("result") {
                    None | Some(Value::Null) => {}
                    Some(result) => {
                        let (output, error) = result_text(result)
                            .ok_or_else(|| at("`result` must be a string or a list of parts"))?;
                        results.push(json!({
                            "role": "tool",
                            "tool_call_id": id,
                            "content": output,
                            "is_error": error || failed,
                        }));
                    }
                }
            }
            let mut m = json!({"role": "assistant", "content": text});
            if !tool_calls.is_empty() {
                m["tool_calls"] = Value::Array(tool_calls);
            }
            if !reasoning.is_empty() {
                m["reasoning"] = Value::String(reasoning.join("\n"));
            }
            let mut out = vec![m];
            out.extend(results);
            Ok(out)
        }
        t if CLI_NOTES.contains(&t) => Ok(Vec::new()),
        other => Err(BadInput::at(
            line,
            format!("unknown record type `{other}`; expected user, gemini, info, error or warning"),
        )),
    }
}

/// The text of a string, a part, or a list of parts (text parts only); `None` for any other
/// value.
fn parts_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some(String::new()),
        Value::String(s) => Some(s.clone()),
        Value::Object(part) => Some(
            part.get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        ),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    _ => p.get("text").and_then(Value::as_str),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// A recorded tool result's text and failure flag: its `functionResponse` parts' responses
/// and its text parts, in order.
fn result_text(v: &Value) -> Option<(String, bool)> {
    let parts = match v {
        Value::String(s) => return Some((s.clone(), false)),
        Value::Object(_) => std::slice::from_ref(v),
        Value::Array(parts) => parts.as_slice(),
        _ => return None,
    };
    let mut texts = Vec::new();
    let mut error = false;
    for p in parts {
        if let Some(fr) = p
            .get("functionResponse")
            .or_else(|| p.get("function_response"))
        {
            let (t, e) = response_text(fr.get("response").unwrap_or(&Value::Null));
            texts.push(t);
            error |= e;
        } else if let Some(t) = p.as_str().or_else(|| p.get("text").and_then(Value::as_str)) {
            texts.push(t.to_owned());
        }
    }
    Some((texts.join("\n"), error))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::{Args, Format, Kind, parse};

    fn kinds(items: &[Item]) -> Vec<&'static str> {
        items.iter().map(|i| i.kind.name()).collect()
    }

    fn strip(items: &[Item]) -> Vec<(u64, Kind)> {
        items.iter().map(|i| (i.turn, i.kind.clone())).collect()
    }

    const CONTENTS: &[&str] = &[
        r#"{"role":"user","parts":[{"text":"list files"}]}"#,
        r#"{"role":"model","parts":[{"text":"look","thought":true},{"text":"Listing."},{"functionCall":{"name":"ls","args":{}}},{"functionCall":{"name":"ls","args":{"path":"src"}}}]}"#,
        r#"{"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"output":"a b"}}},{"functionResponse":{"name":"ls","response":{"output":"c"}}}]}"#,
        r#"{"role":"model","parts":[{"text":"done"}]}"#,
    ];

    #[test]
    fn contents_read_as_the_same_conversation_as_chat_messages() {
        let array = format!("[\n{}\n]", CONTENTS.join(",\n"));
        let jsonl = CONTENTS.join("\n");
        let body = format!(
            "{{\"contents\": [\n{}\n], \"systemInstruction\": {{\"parts\": [{{\"text\": \"be brief\"}}]}}}}",
            CONTENTS.join(",\n")
        );
        let chat = parse(
            r#"[
{"role":"user","content":"list files"},
{"role":"assistant","reasoning":"look","content":"Listing.","tool_calls":[
 {"id":"gemini_call_1","type":"function","function":{"name":"ls","arguments":"{}"}},
 {"id":"gemini_call_2","type":"function","function":{"name":"ls","arguments":"{\"path\":\"src\"}"}}]},
{"role":"tool","tool_call_id":"gemini_call_1","content":"a b"},
{"role":"tool","tool_call_id":"gemini_call_2","content":"c"},
{"role":"assistant","content":"done"}
]"#,
        )
        .unwrap();
        for text in [array, jsonl, body] {
            let t = parse(&text).unwrap();
            assert_eq!(t.format, Format::Gemini, "{text}");
            assert_eq!(strip(&t.items), strip(&chat.items), "{text}");
        }
        let t = parse(&CONTENTS.join("\n")).unwrap();
        // Lines point at the content each event came from.
        let lines: Vec<Line> = t.items.iter().map(|i| i.line).collect();
        assert_eq!(lines, [1, 2, 2, 2, 2, 3, 3, 4]);
    }

    #[test]
    fn responses_pair_by_id_then_by_the_oldest_call_of_the_same_name() {
        let t = parse(
            r#"[
{"role":"model","parts":[{"functionCall":{"name":"read","args":{"p":"a"}}},{"functionCall":{"name":"grep","args":{}}},{"functionCall":{"name":"read","args":{"p":"b"}}},{"functionCall":{"id":"x9","name":"read","args":{"p":"c"}}}]},
{"role":"function","parts":[{"functionResponse":{"id":"x9","name":"read","response":{"output":"C"}}},{"functionResponse":{"name":"read","response":{"output":"A"}}},{"functionResponse":{"name":"grep","response":{"error":"bad pattern"}}},{"functionResponse":{"name":"read","response":{"result":"B"}}}]}
]"#,
        )
        .unwrap();
        let pairs: Vec<(String, String, bool)> = t
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::Result {
                    id, output, error, ..
                } => Some((id.clone(), output.clone(), *error)),
                _ => None,
            })
            .collect();
        assert_eq!(
            pairs,
            [
                ("x9".into(), "C".into(), false),
                ("gemini_call_1".into(), "A".into(), false),
                ("gemini_call_2".into(), "bad pattern".into(), true),
                ("gemini_call_3".into(), "B".into(), false),
            ]
        );
    }

    #[test]
    fn an_unpaired_response_is_kept_and_answers_no_later_call() {
        let t = parse(
            r#"[
{"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"output":"stale"}}}]},
{"role":"model","parts":[{"functionCall":{"name":"ls"}}]},
{"role":"user","parts":[{"functionResponse":{"name":"cat","response":{"output":"?"}}},{"text":"go on"}]}
]"#,
        )
        .unwrap();
        assert_eq!(kinds(&t.items), ["result", "call", "result", "user"]);
        let ids: Vec<&str> = t
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::Call { id, .. } | Kind::Result { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        // Three distinct ids: neither response answers the `ls` call.
        assert_eq!(ids.len(), 3);
        assert!(
            ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
            "{ids:?}"
        );
        // Text beside a result is the host's.
        assert!(matches!(
            &t.items[3].kind,
            Kind::User { injected: true, .. }
        ));
    }

    #[test]
    fn consecutive_model_contents_are_one_answer() {
        // A streamed answer as google-genai's chats keep it: a content per piece.
        let pieces = parse(
            r#"[
{"role":"user","parts":[{"text":"list files"}]},
{"role":"model","parts":[{"text":"List"}]},
{"role":"model","parts":[{"text":"ing."}]},
{"role":"model","parts":[{"functionCall":{"name":"ls","args":{}}}]},
{"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"output":"a b"}}}]}
]"#,
        )
        .unwrap();
        let whole = parse(
            r#"[
{"role":"user","parts":[{"text":"list files"}]},
{"role":"model","parts":[{"text":"Listing."},{"functionCall":{"name":"ls","args":{}}}]},
{"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"output":"a b"}}}]}
]"#,
        )
        .unwrap();
        assert_eq!(strip(&pieces.items), strip(&whole.items));
        let lines: Vec<Line> = pieces.items.iter().map(|i| i.line).collect();
        assert_eq!(lines, [2, 3, 3, 6]);
    }

    #[test]
    fn a_synthetic_id_never_repeats_a_recorded_one() {
        let t = parse(
            r#"[{"role":"model","parts":[{"functionCall":{"id":"gemini_call_1","name":"a"}},{"functionCall":{"name":"b"}},{"functionCall":{"id":"gemini_call_1","name":"c"}}]}]"#,
        )
        .unwrap();
        let ids: HashSet<String> = t
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::Call { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 3, "{ids:?}");
    }

    #[test]
    fn snake_case_parts_and_string_args_are_read() {
        let t = parse(
            r#"[{"role":"model","parts":[{"function_call":{"name":"bash","args":"{\"command\": \"ls\"}"}},{"inline_data":{"mime_type":"image/png","data":""}},{"thoughtSignature":"c2ln"}]},
{"role":"tool","parts":[{"function_response":{"name":"bash","response":{"stdout":"x"}}}]}]"#,
        )
        .unwrap();
        assert_eq!(kinds(&t.items), ["call", "result"]);
        assert!(
            matches!(&t.items[0].kind, Kind::Call { arguments: Args::Json(a), .. } if a["command"] == "ls")
        );
        // A response with no text field is its JSON text.
        assert!(
            matches!(&t.items[1].kind, Kind::Result { output, .. } if output == r#"{"stdout":"x"}"#)
        );
    }

    #[test]
    fn malformed_contents_name_their_line() {
        for (text, line, needle) in [
            (
                "[\n{\"role\":\"user\",\"parts\":[]},\n{\"role\":\"robot\",\"parts\":[]}\n]",
                3,
                "unknown role `robot`",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":{}}\n]",
                2,
                "`parts` must be an array",
            ),
            (
                "[\n{\"role\":7,\"parts\":[]}\n]",
                2,
                "`role` must be a string",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":[{\"text\":3}]}\n]",
                2,
                "parts[0]: `text` must be a string",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":[{\"text\":\"a\"},{\"mystery\":1}]}\n]",
                2,
                "parts[1]: unknown part",
            ),
            (
                "[\n{\"role\":\"model\",\"parts\":[{\"functionCall\":{\"args\":{}}}]}\n]",
                2,
                "`functionCall.name` must be a string",
            ),
            (
                "[\n{\"role\":\"model\",\"parts\":[{\"functionCall\":{\"name\":\"a\",\"args\":[1]}}]}\n]",
                2,
                "`functionCall.args` must be an object",
            ),
            (
                "[\n{\"role\":\"model\",\"parts\":[{\"functionCall\":{\"name\":\"a\",\"id\":5}}]}\n]",
                2,
                "`functionCall.id` must be a string",
            ),
            (
                "[\n{\"role\":\"model\",\"parts\":[{\"functionCall\":\"ls\"}]}\n]",
                2,
                "`functionCall` must be an object",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":[{\"functionCall\":{\"name\":\"a\"}}]}\n]",
                2,
                "belongs in a `model` content",
            ),
            (
                "[\n{\"role\":\"model\",\"parts\":[{\"functionResponse\":{\"name\":\"a\"}}]}\n]",
                2,
                "belongs in a `user`",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":[{\"text\":\"a\",\"thought\":\"yes\"}]}\n]",
                2,
                "`thought` must be true or false",
            ),
            (
                "[\n{\"role\":\"user\",\"parts\":[\"hi\"]}\n]",
                2,
                "a part must be a JSON object",
            ),
            (
                "{\"role\":\"user\",\"parts\":[]}\n{\"role\":\"model\",\"parts\":[{\"functionCall\":{}}]}\n",
                2,
                "`functionCall.name`",
            ),
            (
                "{\"role\":\"user\",\"parts\":[]}\n{\"role\":\"model\",\"parts\":[\n",
                2,
                "invalid JSON",
            ),
            ("{\"contents\": 3}", 1, "`contents` must be an array"),
            (
                "[\n{\"role\":\"user\",\"parts\":[]},\n7\n]",
                3,
                "must be a JSON object",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e:?}");
            assert!(e.message.contains(needle), "{text}: {}", e.message);
        }
    }

    /// The model's parts of `CONTENTS[1]`, as a `generateContent` response's first candidate.
    const MODEL_PARTS: &str = r#"[{"text":"look","thought":true},{"text":"Listing."},{"functionCall":{"name":"ls","args":{}}},{"functionCall":{"name":"ls","args":{"path":"src"}}}]"#;

    #[test]
    fn a_response_object_reads_as_its_first_candidates_content() {
        let response = format!(
            "{{\n \"candidates\": [\n  {{\n   \"content\": {{\"role\": \"model\", \"parts\": {MODEL_PARTS}}},\n   \"finishReason\": \"STOP\",\n   \"index\": 0\n  }},\n  {{\"content\": {{\"role\": \"model\", \"parts\": [{{\"functionCall\": {{\"name\": \"rm\", \"args\": {{}}}}}}]}}, \"index\": 1}}\n ],\n \"usageMetadata\": {{\"promptTokenCount\": 10}},\n \"modelVersion\": \"gemini-2.5-pro\",\n \"responseId\": \"r1\"\n}}"
        );
        let t = parse(&response).unwrap();
        assert_eq!(t.format, Format::Gemini);
        let alone = parse(&format!("[{}]", CONTENTS[1])).unwrap();
        assert_eq!(strip(&t.items), strip(&alone.items));
        // At the line of the first candidate's content; the second candidate is not read.
        assert!(t.items.iter().all(|i| i.line == 4));
        assert!(
            !t.items
                .iter()
                .any(|i| matches!(&i.kind, Kind::Call { tool, .. } if tool == "rm"))
        );
        // A role-less content is the model's; a blocked prompt adds nothing.
        let bare = format!(r#"{{"candidates":[{{"content":{{"parts":{MODEL_PARTS}}}}}]}}"#);
        assert_eq!(strip(&parse(&bare).unwrap().items), strip(&alone.items));
        for empty in [
            r#"{"candidates":[],"promptFeedback":{"blockReason":"SAFETY"}}"#,
            r#"{"candidates":[{"finishReason":"SAFETY","index":0}]}"#,
        ] {
            assert!(parse(empty).unwrap().items.is_empty(), "{empty}");
        }
    }

    #[test]
    fn a_request_and_response_record_is_the_contents_then_the_answer() {
        let record = format!(
            "{{\"contents\": [\n{}\n],\n\"generationConfig\": {{}},\n\"candidates\": [{{\"content\": {}, \"finishReason\": \"STOP\"}}],\n\"usageMetadata\": {{}}}}",
            CONTENTS[..3].join(",\n"),
            CONTENTS[3]
        );
        let t = parse(&record).unwrap();
        assert_eq!(t.format, Format::Gemini);
        let all = parse(&format!("[{}]", CONTENTS.join(",\n"))).unwrap();
        assert_eq!(strip(&t.items), strip(&all.items));
        assert_eq!(t.items.last().map(|i| i.line), Some(7));
    }

    #[test]
    fn streamed_chunks_are_one_model_content_until_a_finish_reason() {
        let chunk = |parts: &str, finish: &str| {
            format!(
                r#"{{"candidates":[{{"content":{{"role":"model","parts":{parts}}}{finish},"index":0}}],"modelVersion":"gemini-2.5-flash"}}"#
            )
        };
        let stop = r#","finishReason":"STOP""#;
        let chunks = [
            chunk(r#"[{"text":"lo","thought":true}]"#, ""),
            chunk(r#"[{"text":"ok","thought":true},{"text":"List"}]"#, ""),
            chunk(r#"[{"text":"ing."}]"#, ""),
            chunk(r#"[{"functionCall":{"name":"ls","args":{}}}]"#, ""),
            chunk(
                r#"[{"functionCall":{"name":"ls","args":{"path":"src"}}}]"#,
                stop,
            ),
            r#"{"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":9}}"#.to_owned(),
            chunk(r#"[{"text":"do"}]"#, ""),
            chunk(r#"[{"text":"ne"}]"#, stop),
        ];
        // Two answers (an empty user content keeps the contents apart, as a finish reason keeps
        // the chunks apart).
        let expected = parse(&format!(
            "[{},\n{{\"role\":\"user\",\"parts\":[]}},\n{}]",
            CONTENTS[1], CONTENTS[3]
        ))
        .unwrap();
        let jsonl = parse(&chunks.join("\n")).unwrap();
        let array = parse(&format!("[\n{}\n]", chunks.join(",\n"))).unwrap();
        for t in [&jsonl, &array] {
            assert_eq!(t.format, Format::Gemini);
            assert_eq!(strip(&t.items), strip(&expected.items));
        }
        let lines: Vec<Line> = jsonl.items.iter().map(|i| i.line).collect();
        assert_eq!(lines, [1, 1, 1, 1, 7]);
        assert!(
            matches!(&jsonl.items[0].kind, Kind::Text { text, reasoning: true, .. } if text == "look")
        );
    }

    #[test]
    fn malformed_responses_name_their_line() {
        let ok = r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"a"}]}}]}"#;
        for (bad, needle) in [
            ("[1]", "must be a JSON object"),
            (r#"{"text":"hi"}"#, "needs `candidates`"),
            (
                r#"{"candidates":{"content":{}}}"#,
                "`candidates` must be an array",
            ),
            (
                r#"{"candidates":[7]}"#,
                "candidates[0] must be a JSON object",
            ),
            (
                r#"{"candidates":[{"content":"hi"}]}"#,
                "candidates[0].content must be",
            ),
            (
                r#"{"candidates":[{"content":{"role":"user","parts":[]}}]}"#,
                "content.role must be `model`",
            ),
            (
                r#"{"candidates":[{"content":{"role":"model","parts":{"text":"a"}}}]}"#,
                "content.parts must be an array",
            ),
            (
                r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"args":{}}}]},"finishReason":"STOP"}]}"#,
                "parts[0]",
            ),
            (r#"{"candidates":[{"#, "invalid JSON"),
        ] {
            // Each chunk ends its content, so the bad one is read at its own line.
            let ok = ok.replace("}]}}]", "}]},\"finishReason\":\"STOP\"}]");
            let text = format!("{ok}\n\n{bad}\n{ok}\n");
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 3, "{bad}: {e:?}");
            assert!(e.message.contains(needle), "{bad}: {}", e.message);
        }
        // A single response object: the error names the candidate's line.
        let e = parse("{\n\"candidates\": [\n{\"content\": {\"role\": \"model\", \"parts\": [{\"mystery\": 1}]}}\n]\n}")
            .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("unknown part"), "{}", e.message);
    }

    #[test]
    fn a_gemini_cli_session_file_reads_as_the_same_conversation() {
        let session = r#"{"sessionId": "s", "projectHash": "h", "startTime": "t", "lastUpdated": "t", "messages": [
{"id": "1", "timestamp": "t", "type": "user", "content": "list files"},
{"id": "2", "timestamp": "t", "type": "gemini", "content": "Listing.", "thoughts": [{"subject": "look", "description": "", "timestamp": "t"}],
 "toolCalls": [
  {"id": "ls-1", "name": "ls", "args": {}, "status": "success", "result": [{"functionResponse": {"id": "ls-1", "name": "ls", "response": {"output": "a b"}}}]},
  {"id": "ls-2", "name": "ls", "args": {"path": "src"}, "status": "error", "result": [{"functionResponse": {"id": "ls-2", "name": "ls", "response": {"error": "no src"}}}]}]},
{"id": "3", "timestamp": "t", "type": "info", "content": "Request cancelled."},
{"id": "4", "timestamp": "t", "type": "gemini", "content": "done"}
]}"#;
        let t = parse(session).unwrap();
        assert_eq!(t.format, Format::GeminiCli);
        assert_eq!(
            kinds(&t.items),
            [
                "user", "text", "text", "call", "call", "result", "result", "text"
            ]
        );
        assert!(
            matches!(&t.items[6].kind, Kind::Result { id, output, error: true, .. } if id == "ls-2" && output == "no src")
        );
        assert_eq!(t.items[7].line, 8);
        for (bad, needle) in [
            (
                r#"{"type": "gemini", "toolCalls": {}}"#,
                "`toolCalls` must be an array",
            ),
            (
                r#"{"type": "gemini", "toolCalls": [{"args": {}}]}"#,
                "toolCalls[0]: `toolCall.name`",
            ),
            (
                r#"{"type": "gemini", "toolCalls": [{"name": "a", "args": 3}]}"#,
                "`args` must be an object",
            ),
            (
                r#"{"type": "gemini", "toolCalls": [{"name": "a", "result": 3}]}"#,
                "`result` must be",
            ),
            (r#"{"type": "user", "content": 3}"#, "`content` must be"),
            (
                r#"{"type": "model", "content": "x"}"#,
                "unknown record type `model`",
            ),
        ] {
            let text = format!(
                "{{\"messages\": [\n{{\"type\": \"user\", \"content\": \"go\"}},\n{bad}\n]}}"
            );
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 3, "{bad}: {e:?}");
            assert!(e.message.contains(needle), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn deep_and_long_inputs_stay_bounded() {
        // Nesting past the JSON reader's depth limit is an error, not a stack overflow.
        let deep = format!(
            "[{{\"role\":\"model\",\"parts\":[{{\"functionCall\":{{\"name\":\"a\",\"args\":{{\"x\":{}1{}}}}}}}]}}]",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse(&deep).is_err());
        // Many unanswered calls and many responses naming no call: linear, not quadratic.
        let n = 20_000;
        let calls: Vec<String> = (0..n)
            .map(|i| format!("{{\"functionCall\":{{\"name\":\"t{}\"}}}}", i % 3))
            .collect();
        let answers: Vec<String> = (0..n)
            .map(|i| format!("{{\"functionResponse\":{{\"name\":\"u{i}\",\"response\":{{}}}}}}"))
            .collect();
        let text = format!(
            "[{{\"role\":\"model\",\"parts\":[{}]}},\n{{\"role\":\"user\",\"parts\":[{}]}}]",
            calls.join(","),
            answers.join(",")
        );
        let start = std::time::Instant::now();
        let t = parse(&text).unwrap();
        assert_eq!(t.items.len(), 2 * n);
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}
