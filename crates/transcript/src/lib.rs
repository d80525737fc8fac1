//! Recorded conversations, read into one list of events.
//!
//! These formats are recognised from the content, not the file name:
//!
//! - **loopguard events**: JSON Lines, one event object per line with a `type` of `call`,
//!   `result`, `text`, `user` or `reset`; blank lines and lines starting with `//` are skipped.
//!   Unknown types and unknown keys are errors, so a typo never silently changes a replay.
//!   The JSON Schema is printed by `loopctl schema --events`.
//! - **OpenAI chat-completions messages**: a JSON array of messages, the same as JSON Lines, or a
//!   request body (an object with a `messages` array; its other keys are ignored).
//! - **Anthropic messages**: the same shapes, with `tool_use` / `tool_result` content blocks.
//!   OpenAI and Anthropic messages may be mixed; each message is read by its own shape.
//! - **OpenAI Responses items** (Codex and other Responses clients): a JSON array of items, the
//!   same as JSON Lines, a request body with `input` (a string or a list of items), a response
//!   object with an `output` list, or a record with both (the input, then the output).
//!   `message` items (and items with a `role` and no `type`), `function_call`,
//!   `custom_tool_call` (its raw `input` text) and `local_shell_call` (its `action`) are
//!   calls and text, `function_call_output` and its kin their results; `reasoning` summaries
//!   are reasoning; calls of tools the server runs (web search, file search, …) are skipped.
//!   A run of output items is one assistant message ([`messages`]). A Codex session rollout
//!   (JSON Lines of `{"type": "response_item", "payload": <item>}`) is read the same way, its
//!   other lines (`session_meta`, `turn_context`, `event_msg`, `compacted`) skipped; so is
//!   the older form Codex wrote before (a first line of session metadata, then bare items,
//!   `{"record_type": "state"}` lines skipped) (`codex.rs`).
//! - **Gemini contents** (Gemini CLI, google-genai): an array of `{"role", "parts"}` contents,
//!   the same as JSON Lines, or a request body with `contents`; `functionCall` and
//!   `functionResponse` parts are calls and results, paired by `id`, else with the oldest
//!   unanswered call of the same name (`gemini.rs`). A `generateContent` response (an object
//!   with `candidates`) is its first candidate's content; a record with both `contents` and
//!   `candidates` is the request, then the response; JSON Lines or an array of responses
//!   are streamed chunks, one model content per run ending with a `finishReason`. Gemini
//!   CLI's session files (an object with `messages` of `user` and `gemini` records, whose
//!   `toolCalls` carry their results) are read too.
//! - **Claude Code sessions**: JSON Lines whose `user` and `assistant` lines hold Anthropic
//!   messages; bookkeeping lines (`summary`, `system`, `file-history-snapshot`, …) are
//!   skipped, and the several lines of one streamed message are one message
//!   (`claude_code.rs`).
//!
//! Messages carry no time; each event is placed one second after the previous one unless the
//! message has a numeric `time` (seconds). Claude Code and Codex lines carry an RFC 3339
//! `timestamp`, the time of the line's first event, never going back (`timestamp.rs`).
//! Tool-call arguments that are not valid JSON are kept as raw text. A result whose id names
//! no call is kept as it is (a transcript may start after its calls). Every reader is linear
//! in its input and nests no deeper than the JSON reader's depth limit (128), so hostile input
//! is an error naming its line, never a crash.
//!
//! ```
//! use loopguard_transcript::{Format, Kind, parse};
//!
//! let text = r#"[
//!   {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
//!     "function": {"name": "read_file", "arguments": "{\"path\": \"a.txt\"}"}}]},
//!   {"role": "tool", "tool_call_id": "c1", "content": "hello"}
//! ]"#;
//! let transcript = parse(text).expect("valid messages");
//! assert_eq!(transcript.format, Format::Messages);
//! let Kind::Call { tool, .. } = &transcript.items[0].kind else {
//!     panic!("a call first");
//! };
//! assert_eq!(tool, "read_file");
//! assert!(matches!(&transcript.items[1].kind, Kind::Result { output, .. } if output == "hello"));
//!
//! let bad = parse("{\"type\": \"call\", \"tool\": 3}\n").unwrap_err();
//! assert_eq!(bad.line, 1);
//! ```

#![warn(missing_docs)]

mod claude_code;
mod codex;
mod gemini;
pub mod messages;
mod py_literal;
pub mod replay;
mod text_calls;
mod timestamp;

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;
use serde_json::value::RawValue;

/// The prose of an assistant's text that plainly writes a tool call in it (a ReAct action,
/// XML tool use, function tags, a JSON action, a code action: the forms `simulate` reads as a
/// call), without the call; `None` when the text writes no such call. A closing shell block is
/// no plain call: it is one only when an observation answers it.
pub fn prose_beside_text_call(text: &str) -> Option<&str> {
    let call = text_calls::text_call(text)?;
    if !call.sure {
        return None;
    }
    Some(text.get(..call.prose).unwrap_or(text))
}

/// Where an event came from: the 1-based line of its message or event object.
pub type Line = usize;

/// The format a transcript was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// loopguard events, one JSON object per line.
    Events,
    /// OpenAI or Anthropic chat messages or OpenAI Responses items (an array, JSON Lines or a
    /// request body).
    Messages,
    /// Gemini contents (an array, JSON Lines or a request body with `contents`) or
    /// `generateContent` responses.
    Gemini,
    /// A Claude Code session (JSON Lines of `user`, `assistant` and bookkeeping lines).
    ClaudeCode,
    /// A Gemini CLI session file (an object with `messages` of `user` and `gemini` records).
    GeminiCli,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Events => "loopguard events",
            Format::Messages => "chat messages",
            Format::Gemini => "Gemini contents",
            Format::ClaudeCode => "Claude Code session",
            Format::GeminiCli => "Gemini CLI session",
        })
    }
}

/// Tool-call arguments as recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum Args {
    /// Arguments that parsed as JSON.
    Json(Value),
    /// Argument text that is not valid JSON, kept as written.
    Raw(String),
}

impl Args {
    fn from_text(text: &str) -> Args {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => Args::Json(v),
            Err(_) => Args::Raw(text.to_owned()),
        }
    }

    /// A short one-line rendering for timelines: at most `max` characters (see [`shorten`]).
    pub fn summary(&self, max: usize) -> String {
        let text = match self {
            Args::Json(v) => v.to_string(),
            Args::Raw(s) => s.clone(),
        };
        shorten(&text, max)
    }
}

/// Cuts `text` to at most `max` characters on one line: control characters (newlines
/// included) become spaces, and a cut text ends with `…` (counted in `max`).
pub fn shorten(text: &str, max: usize) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut s: String = one_line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// One event of a transcript, owning its text.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// The assistant calls a tool.
    Call {
        /// The call id that its result refers to; may be empty.
        id: String,
        /// The tool's name.
        tool: String,
        /// The arguments as recorded.
        arguments: Args,
    },
    /// A tool's result.
    Result {
        /// The id of the call it answers.
        id: String,
        /// The result text.
        output: String,
        /// Whether the result is flagged as an error.
        error: bool,
        /// The exit code of a command, when the result has one.
        exit_code: Option<i32>,
    },
    /// Assistant text.
    Text {
        /// The text.
        text: String,
        /// A streamed piece of a message rather than a whole message.
        chunk: bool,
        /// The last piece of a streamed message.
        end: bool,
        /// Reasoning (thinking) text rather than an answer.
        reasoning: bool,
        /// The text accompanies tool calls of the same assistant message.
        narration: bool,
    },
    /// A user-role message.
    User {
        /// The message text.
        text: String,
        /// Sent by the host or a framework (a reminder beside tool results), not a person.
        injected: bool,
    },
    /// The session starts over: everything before is forgotten.
    Reset,
}

impl Kind {
    /// The event's `type` word: `call`, `result`, `text`, `user` or `reset`.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Call { .. } => "call",
            Kind::Result { .. } => "result",
            Kind::Text { .. } => "text",
            Kind::User { .. } => "user",
            Kind::Reset => "reset",
        }
    }
}

/// One event of a transcript with where and when it happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// The line it was read from.
    pub line: Line,
    /// The session it belongs to (`main` when the transcript names none).
    pub session: String,
    /// Event time in milliseconds: the recorded `time` (seconds) or `timestamp` (since the
    /// Unix epoch), or one second after the previous event (the first at 0).
    pub time_ms: u64,
    /// 1-based index of the assistant message this event belongs to (0 before the first).
    pub turn: u64,
    /// What happened.
    pub kind: Kind,
}

/// A transcript that could not be read: the line and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct BadInput {
    /// The 1-based line.
    pub line: Line,
    /// The 1-based column, when the JSON parser reports one.
    pub column: Option<usize>,
    /// What is wrong, one lowercase line.
    pub message: String,
}

impl BadInput {
    fn at(line: Line, message: impl Into<String>) -> BadInput {
        BadInput {
            line,
            column: None,
            message: message.into(),
        }
    }

    fn json(e: &serde_json::Error, line_offset: Line) -> BadInput {
        BadInput {
            line: line_offset + e.line().max(1) - 1,
            column: Some(e.column()),
            message: format!("invalid JSON: {e}"),
        }
    }
}

/// The session used for events that name none.
pub(crate) const DEFAULT_SESSION: &str = "main";

/// A transcript read into events.
#[derive(Debug)]
pub struct Transcript {
    /// The format it was recognised as.
    pub format: Format,
    /// Every event, in order.
    pub items: Vec<Item>,
}

/// Reads a transcript of any supported format.
pub fn parse(text: &str) -> Result<Transcript, BadInput> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .find(|(_, l)| !l.is_empty() && !l.starts_with("//"));
    let Some((first_line, first)) = first else {
        return Err(BadInput::at(1, "the transcript holds no event or message"));
    };
    if first.starts_with('[') {
        let raw: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| BadInput::json(&e, 1))?;
        return messages(text, &raw);
    }
    if !first.starts_with('{') {
        return Err(BadInput::at(
            first_line,
            "expected JSON: an array of messages, an object with `messages`, or JSON Lines",
        ));
    }
    // A single JSON document that is an object with `messages`: a request body.
    if let Ok(doc) = serde_json::from_str::<Body<'_>>(text) {
        return messages(text, &doc.messages);
    }
    // A Responses request body: an object with `input` (a list of items, or a string).
    if let Ok(doc) = serde_json::from_str::<ResponsesBody<'_>>(text) {
        if let Ok(output) = serde_json::from_str::<Output<'_>>(text) {
            // A record of a request and its response: the input, then the output.
            return input_and_output(text, doc.input, &output.output);
        }
        let input: Value =
            serde_json::from_str(doc.input.get()).map_err(|e| BadInput::json(&e, 1))?;
        if let Value::Array(list) = &input {
            let raw: Vec<&RawValue> =
                serde_json::from_str(doc.input.get()).map_err(|e| BadInput::json(&e, 1))?;
            if !list.is_empty() {
                return messages(text, &raw);
            }
        }
        return Ok(Transcript {
            format: Format::Messages,
            items: messages::read_responses_input(&input, messages::Mode::Strict)?,
        });
    }
    // A Gemini request body: an object with `contents`; with `candidates` too, a record of a
    // request and its response.
    if let Ok(doc) = serde_json::from_str::<GeminiBody<'_>>(text) {
        let Ok(contents) = serde_json::from_str::<Vec<&RawValue>>(doc.contents.get()) else {
            return Err(BadInput::at(
                Lines::new(text).of(doc.contents.get()),
                "`contents` must be an array of contents",
            ));
        };
        let mut values = positioned(text, &contents)?;
        if let Ok(response) = serde_json::from_str::<GeminiResponse<'_>>(text) {
            values.extend(gemini_response(text, &response)?);
        }
        let refs: Vec<(Line, &Value)> = values.iter().map(|(l, v)| (*l, v)).collect();
        return Ok(Transcript {
            format: Format::Gemini,
            items: gemini::read(&refs)?,
        });
    }
    // A Gemini `generateContent` response: an object with `candidates`.
    if let Ok(response) = serde_json::from_str::<GeminiResponse<'_>>(text) {
        let values = gemini_response(text, &response)?;
        let refs: Vec<(Line, &Value)> = values.iter().map(|(l, v)| (*l, v)).collect();
        return Ok(Transcript {
            format: Format::Gemini,
            items: gemini::read_answers(&refs)?,
        });
    }
    // A Responses response object: an object with an `output` list of items.
    if let Ok(doc) = serde_json::from_str::<Output<'_>>(text)
        && doc.kind.is_none()
    {
        return responses_items(text, &doc.output);
    }
    // Otherwise JSON Lines; the first line says which kind.
    let first_value: Value =
        serde_json::from_str(first).map_err(|e| BadInput::json(&e, first_line))?;
    if codex::is_rollout_line(&first_value) {
        return codex::read(text);
    }
    if codex::is_legacy_meta_line(&first_value) {
        return codex::read_legacy(text);
    }
    if claude_code::is_session_line(&first_value) {
        return Ok(Transcript {
            format: Format::ClaudeCode,
            items: claude_code::read(text)?,
        });
    }
    if first_value.get("role").is_some()
        || messages::is_responses_item(&first_value)
        || gemini::is_content(&first_value)
        || gemini::is_response(&first_value)
    {
        let raw = json_lines::<&RawValue>(text)
            .map(|r| r.map(|(_, v)| v))
            .collect::<Result<Vec<_>, _>>()?;
        return messages(text, &raw);
    }
    if first_value.get("messages").is_some() {
        // An object with `messages` that did not read as a request body.
        let e = serde_json::from_str::<Body<'_>>(text).err();
        return Err(match e {
            Some(e) => BadInput::json(&e, 1),
            None => BadInput::at(first_line, "unreadable request body"),
        });
    }
    events(text)
}

#[derive(serde::Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct ResponsesBody<'a> {
    #[serde(borrow)]
    input: &'a RawValue,
}

/// A Responses response object (`"object": "response"`), or a record with its `output`.
#[derive(serde::Deserialize)]
struct Output<'a> {
    #[serde(borrow)]
    output: Vec<&'a RawValue>,
    /// Set on objects that are something else: a loopguard event, a stream event.
    #[serde(rename = "type", default, borrow)]
    kind: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct GeminiBody<'a> {
    #[serde(borrow)]
    contents: &'a RawValue,
}

/// A Gemini `generateContent` response, or a record with one.
#[derive(serde::Deserialize)]
struct GeminiResponse<'a> {
    #[serde(borrow)]
    candidates: &'a RawValue,
}

/// The first candidate of a response, to find its content's line.
#[derive(serde::Deserialize)]
struct GeminiCandidate<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// The model content a document holding one Gemini response adds, at the line where its first
/// candidate's content starts.
fn gemini_response(
    text: &str,
    response: &GeminiResponse<'_>,
) -> Result<Vec<(Line, Value)>, BadInput> {
    let raw = response.candidates.get();
    let content = serde_json::from_str::<Vec<&RawValue>>(raw)
        .ok()
        .and_then(|c| c.first().copied())
        .and_then(|c| serde_json::from_str::<GeminiCandidate<'_>>(c.get()).ok())
        .and_then(|c| c.content);
    let line = Lines::new(text).of(content.map_or(raw, RawValue::get));
    let value: Value = serde_json::from_str(text).map_err(|e| BadInput::json(&e, 1))?;
    let Value::Object(mut obj) = value else {
        return Err(BadInput::at(
            line,
            "a Gemini response must be a JSON object",
        ));
    };
    // The request's keys of a record are not the response's.
    obj.remove("contents");
    gemini::response_contents(&[(line, &Value::Object(obj))])
}

/// Finds the 1-based lines where slices of a text start, for slices taken in order: each call
/// counts only the newlines since the previous one, so numbering every message of a transcript
/// is linear in its size.
struct Lines<'t> {
    text: &'t str,
    /// Byte offset counted up to, and the line it is on.
    offset: usize,
    line: Line,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Self {
        Lines {
            text,
            offset: 0,
            line: 1,
        }
    }

    /// The 1-based line where `part` (a slice of the text) starts.
    fn of(&mut self, part: &str) -> Line {
        let offset = (part.as_ptr() as usize)
            .saturating_sub(self.text.as_ptr() as usize)
            .min(self.text.len());
        if offset < self.offset {
            // Out of order: count again from the start.
            self.offset = 0;
            self.line = 1;
        }
        let newlines = self
            .text
            .as_bytes()
            .get(self.offset..offset)
            .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        self.line += newlines;
        self.offset = offset;
        self.line
    }
}

// --- loopguard event JSON Lines ----------------------------------------------------------------

const EVENT_KEYS: &[(&str, &[&str])] = &[
    ("call", &["id", "tool", "arguments"]),
    ("result", &["id", "output", "error", "exit_code"]),
    ("text", &["text", "chunk", "end", "reasoning", "narration"]),
    ("user", &["text", "injected"]),
    ("reset", &[]),
];
const COMMON_KEYS: &[&str] = &["type", "session", "time", "turn"];

/// The JSON lines of `text`, each parsed as `T` with its 1-based line number. Blank lines and
/// `//` comments are skipped; a line that does not parse is an error at that line.
fn json_lines<'t, T: serde::Deserialize<'t>>(
    text: &'t str,
) -> impl Iterator<Item = Result<(Line, T), BadInput>> + 't {
    text.lines().enumerate().filter_map(|(i, line)| {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            return None;
        }
        Some(
            serde_json::from_str(t)
                .map(|v| (i + 1, v))
                .map_err(|e| BadInput::json(&e, i + 1)),
        )
    })
}

fn events(text: &str) -> Result<Transcript, BadInput> {
    let mut items = Vec::new();
    let mut clock = Clock::default();
    let mut turns = Turns::default();
    for line in json_lines::<Value>(text) {
        let (n, v) = line?;
        let Value::Object(obj) = &v else {
            return Err(BadInput::at(n, "an event must be a JSON object"));
        };
        let ty = match obj.get("type") {
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(BadInput::at(n, "`type` must be a string")),
            None => return Err(BadInput::at(n, "the event has no `type`")),
        };
        let Some((_, keys)) = EVENT_KEYS.iter().find(|(k, _)| *k == ty) else {
            return Err(BadInput::at(
                n,
                format!("unknown event type `{ty}`; expected call, result, text, user or reset"),
            ));
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !COMMON_KEYS.contains(&k.as_str()) && !keys.contains(&k.as_str()))
        {
            return Err(BadInput::at(
                n,
                format!(
                    "unknown key `{k}` in a `{ty}` event; allowed: {}",
                    COMMON_KEYS
                        .iter()
                        .chain(keys.iter())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let field = Fields { obj, line: n };
        let session = field
            .string("session")?
            .unwrap_or_else(|| DEFAULT_SESSION.to_owned());
        let time_ms = clock.next(field.seconds("time")?);
        let kind = match ty {
            "call" => Kind::Call {
                id: field.string("id")?.unwrap_or_default(),
                tool: field
                    .string("tool")?
                    .ok_or_else(|| BadInput::at(n, "a `call` event needs a `tool`"))?,
                arguments: match obj.get("arguments") {
                    None | Some(Value::Null) => Args::Json(Value::Object(Default::default())),
                    Some(Value::String(s)) => Args::from_text(s),
                    Some(v @ Value::Object(_)) => Args::Json(v.clone()),
                    Some(_) => {
                        return Err(BadInput::at(
                            n,
                            "`arguments` must be an object or a string (raw arguments)",
                        ));
                    }
                },
            },
            "result" => Kind::Result {
                id: field.string("id")?.unwrap_or_default(),
                output: field.string("output")?.unwrap_or_default(),
                error: field.boolean("error")?.unwrap_or(false),
                exit_code: field.exit_code()?,
            },
            "text" => Kind::Text {
                text: field.string("text")?.unwrap_or_default(),
                chunk: field.boolean("chunk")?.unwrap_or(false),
                end: field.boolean("end")?.unwrap_or(false),
                reasoning: field.boolean("reasoning")?.unwrap_or(false),
                narration: field.boolean("narration")?.unwrap_or(false),
            },
            "user" => Kind::User {
                text: field.string("text")?.unwrap_or_default(),
                injected: field.boolean("injected")?.unwrap_or(false),
            },
            _ => Kind::Reset,
        };
        let explicit_turn = match obj.get("turn") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .ok_or_else(|| BadInput::at(n, "`turn` must be a non-negative integer"))?,
            ),
        };
        let turn = turns.next(&session, &kind, explicit_turn);
        items.push(Item {
            line: n,
            session,
            time_ms,
            turn,
            kind,
        });
    }
    Ok(Transcript {
        format: Format::Events,
        items,
    })
}

struct Fields<'a> {
    obj: &'a serde_json::Map<String, Value>,
    line: Line,
}

impl Fields<'_> {
    fn string(&self, key: &str) -> Result<Option<String>, BadInput> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(BadInput::at(self.line, format!("`{key}` must be a string"))),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, BadInput> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(BadInput::at(
                self.line,
                format!("`{key}` must be true or false"),
            )),
        }
    }

    fn seconds(&self, key: &str) -> Result<Option<f64>, BadInput> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
                _ => Err(BadInput::at(
                    self.line,
                    format!("`{key}` must be a non-negative number of seconds"),
                )),
            },
            Some(_) => Err(BadInput::at(
                self.line,
                format!("`{key}` must be a number of seconds"),
            )),
        }
    }

    fn exit_code(&self) -> Result<Option<i32>, BadInput> {
        match self.obj.get("exit_code") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|c| i32::try_from(c).ok())
                .map(Some)
                .ok_or_else(|| BadInput::at(self.line, "`exit_code` must be an integer")),
        }
    }
}

/// Event time: explicit seconds, else one second after the previous event.
#[derive(Default)]
struct Clock {
    last_ms: Option<u64>,
}

impl Clock {
    fn next(&mut self, seconds: Option<f64>) -> u64 {
        let ms = match seconds {
            // Bounded above so the conversion cannot saturate surprisingly: ~3 million years.
            Some(s) => (s.min(1e14) * 1000.0).round() as u64,
            None => self.last_ms.map_or(0, |t| t + 1000),
        };
        self.last_ms = Some(ms);
        ms
    }
}

/// Assistant-message numbering for event transcripts: a text turn, or a run of calls that does
/// not follow another call of the same session, starts a new assistant message.
#[derive(Default)]
struct Turns {
    turn: u64,
    /// The kind of the previous event per session: was it a call, or a streamed chunk that did not
    /// end its turn?
    last: HashMap<String, Prev>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Prev {
    Call,
    OpenChunk,
    Other,
}

impl Turns {
    fn next(&mut self, session: &str, kind: &Kind, explicit: Option<u64>) -> u64 {
        let prev = self.last.get(session).copied().unwrap_or(Prev::Other);
        let now = match kind {
            Kind::Call { .. } => Prev::Call,
            Kind::Text {
                chunk: true,
                end: false,
                ..
            } => Prev::OpenChunk,
            _ => Prev::Other,
        };
        let starts = match kind {
            Kind::Call { .. } => prev != Prev::Call && prev != Prev::OpenChunk,
            Kind::Text { .. } => prev != Prev::OpenChunk,
            _ => false,
        };
        if let Some(t) = explicit {
            self.turn = t;
        } else if starts {
            self.turn += 1;
        }
        match self.last.get_mut(session) {
            Some(prev) => *prev = now,
            None => {
                self.last.insert(session.to_owned(), now);
            }
        }
        self.turn
    }
}

// --- chat messages and Responses items ------------------------------------------------------------

/// A list of chat messages, Responses items, Gemini contents or Gemini CLI records: the first
/// element of one of the latter shapes decides for the whole list.
fn messages(text: &str, raw: &[&RawValue]) -> Result<Transcript, BadInput> {
    let values = positioned(text, raw)?;
    let refs: Vec<(Line, &Value)> = values.iter().map(|(l, v)| (*l, v)).collect();
    let any = |shape: fn(&Value) -> bool| values.iter().any(|(_, v)| shape(v));
    let (format, items) = if any(messages::is_responses_item) {
        (
            Format::Messages,
            messages::read_responses_items(&refs, messages::Mode::Strict)?,
        )
    } else if any(gemini::is_response) {
        let contents = gemini::response_contents(&refs)?;
        let refs: Vec<(Line, &Value)> = contents.iter().map(|(l, v)| (*l, v)).collect();
        (Format::Gemini, gemini::read_answers(&refs)?)
    } else if any(gemini::is_cli_record) {
        (Format::GeminiCli, gemini::read_cli_session(&refs)?)
    } else if any(gemini::is_content) {
        (Format::Gemini, gemini::read(&refs)?)
    } else {
        let mut reader = messages::Reader::new(messages::Mode::Strict);
        for &(line, value) in &refs {
            reader.message(line, value)?;
        }
        (Format::Messages, reader.finish())
    };
    Ok(Transcript { format, items })
}

/// Each list element with its line, parsed.
fn positioned(text: &str, raw: &[&RawValue]) -> Result<Vec<(Line, Value)>, BadInput> {
    let mut lines = Lines::new(text);
    let mut values = Vec::with_capacity(raw.len());
    for r in raw {
        let line = lines.of(r.get());
        let value: Value = serde_json::from_str(r.get()).map_err(|e| BadInput::json(&e, line))?;
        values.push((line, value));
    }
    Ok(values)
}

fn responses_items(text: &str, raw: &[&RawValue]) -> Result<Transcript, BadInput> {
    let values = positioned(text, raw)?;
    let refs: Vec<(Line, &Value)> = values.iter().map(|(l, v)| (*l, v)).collect();
    Ok(Transcript {
        format: Format::Messages,
        items: messages::read_responses_items(&refs, messages::Mode::Strict)?,
    })
}

/// A Responses request's `input` (a string or a list of items) followed by its response's
/// `output` items.
fn input_and_output(
    text: &str,
    input: &RawValue,
    output: &[&RawValue],
) -> Result<Transcript, BadInput> {
    let mut values = match serde_json::from_str::<Value>(input.get()) {
        Ok(Value::String(s)) => vec![(
            Lines::new(text).of(input.get()),
            serde_json::json!({"role": "user", "content": s}),
        )],
        Ok(Value::Null) => Vec::new(),
        Ok(Value::Array(_)) => {
            let raw: Vec<&RawValue> =
                serde_json::from_str(input.get()).map_err(|e| BadInput::json(&e, 1))?;
            positioned(text, &raw)?
        }
        Ok(_) => {
            return Err(BadInput::at(
                Lines::new(text).of(input.get()),
                "`input` must be a string or a list of items",
            ));
        }
        Err(e) => return Err(BadInput::json(&e, Lines::new(text).of(input.get()))),
    };
    values.extend(positioned(text, output)?);
    let refs: Vec<(Line, &Value)> = values.iter().map(|(l, v)| (*l, v)).collect();
    Ok(Transcript {
        format: Format::Messages,
        items: messages::read_responses_items(&refs, messages::Mode::Strict)?,
    })
}

/// The JSON Schema of one line of the loopguard event format.
pub fn event_schema() -> Value {
    let common = serde_json::json!({
        "session": {"type": "string", "description": "Session id; default `main`."},
        "time": {"type": "number", "minimum": 0, "description": "Event time in seconds; default: one second after the previous event."},
        "turn": {"type": "integer", "minimum": 0, "description": "1-based assistant message this event belongs to; default: counted from the events."}
    });
    let variant = |ty: &str, desc: &str, props: Value, required: &[&str]| {
        let mut properties = common.as_object().cloned().unwrap_or_default();
        properties.insert("type".into(), serde_json::json!({"const": ty}));
        if let Value::Object(p) = props {
            properties.extend(p);
        }
        let mut req = vec!["type"];
        req.extend_from_slice(required);
        serde_json::json!({
            "description": desc,
            "type": "object",
            "properties": properties,
            "required": req,
            "additionalProperties": false
        })
    };
    serde_json::json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://loopguard.invalid/schema/events.json",
        "title": "loopguard event",
        "description": "One line of a loopguard event transcript (JSON Lines). Blank lines and lines starting with // are skipped.",
        "oneOf": [
            variant("call", "The model asked for a tool to be run.", serde_json::json!({
                "id": {"type": "string", "description": "The call id that results refer to."},
                "tool": {"type": "string"},
                "arguments": {"type": ["object", "string", "null"], "description": "JSON arguments, or the raw text the model produced (kept as text when it is not JSON)."}
            }), &["tool"]),
            variant("result", "A tool produced its output.", serde_json::json!({
                "id": {"type": "string", "description": "The id of the call this answers."},
                "output": {"type": "string"},
                "error": {"type": "boolean", "description": "The tool reported a failure."},
                "exit_code": {"type": ["integer", "null"]}
            }), &[]),
            variant("text", "Assistant text with no tool call: a whole turn, or one streamed chunk.", serde_json::json!({
                "text": {"type": "string"},
                "chunk": {"type": "boolean", "description": "A streamed chunk of a turn."},
                "end": {"type": "boolean", "description": "This chunk ends its turn."},
                "reasoning": {"type": "boolean", "description": "Reasoning (thinking) text."},
                "narration": {"type": "boolean", "description": "The text accompanies tool calls of the same assistant message."}
            }), &[]),
            variant("user", "A message from a person, or a note the host injected.", serde_json::json!({
                "text": {"type": "string"},
                "injected": {"type": "boolean", "description": "The host or framework sent it (a nudge, a \"continue\" prompt, an observation), not a person; it changes no count."}
            }), &[]),
            variant("reset", "Forget everything about the session.", serde_json::json!({}), &[])
        ]
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn kinds(t: &Transcript) -> Vec<&'static str> {
        t.items.iter().map(|i| i.kind.name()).collect()
    }

    #[test]
    fn event_lines_with_comments_and_defaults() {
        let t = parse(
            "// a comment\n\n{\"type\":\"call\",\"tool\":\"ls\",\"id\":\"a\"}\n{\"type\":\"result\",\"id\":\"a\",\"output\":\"x\",\"time\":5}\n",
        )
        .unwrap();
        assert_eq!(t.format, Format::Events);
        assert_eq!(kinds(&t), ["call", "result"]);
        assert_eq!(t.items[0].line, 3);
        assert_eq!(t.items[0].time_ms, 0);
        assert_eq!(t.items[1].time_ms, 5000);
        assert_eq!(t.items[0].session, DEFAULT_SESSION);
    }

    #[test]
    fn unknown_keys_and_types_name_the_line() {
        let e = parse("{\"type\":\"call\",\"tool\":\"ls\"}\n{\"type\":\"call\",\"tol\":\"ls\"}\n")
            .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unknown key `tol`"), "{}", e.message);
        let e = parse("{\"type\":\"cal\"}").unwrap_err();
        assert!(e.message.contains("unknown event type `cal`"));
    }

    #[test]
    fn broken_json_names_line_and_column() {
        let e = parse("{\"type\":\"reset\"}\n{\"type\": \"call\", \"tool\": }\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.column.is_some());
    }

    #[test]
    fn raw_arguments_are_kept() {
        let t = parse(
            r#"[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"command\": \"ls"}}]}]"#,
        )
        .unwrap();
        match &t.items[0].kind {
            Kind::Call { arguments, .. } => {
                assert_eq!(arguments, &Args::Raw("{\"command\": \"ls".into()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn openai_array_jsonl_and_body_read_the_same() {
        let msgs = [
            r#"{"role":"system","content":"be brief"}"#,
            r#"{"role":"user","content":"list files"}"#,
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"ls","arguments":"{\"path\":\"src\"}"}}]}"#,
            r#"{"role":"tool","tool_call_id":"c1","content":"a b"}"#,
            r#"{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"c"}]}"#,
            r#"{"role":"assistant","content":"done"}"#,
        ];
        let array = format!("[\n{}\n]", msgs.join(",\n"));
        let jsonl = msgs.join("\n");
        let body = format!(
            "{{\"model\":\"m\",\"messages\":[\n{}\n]}}",
            msgs.join(",\n")
        );
        let a = parse(&array).unwrap();
        let b = parse(&jsonl).unwrap();
        let c = parse(&body).unwrap();
        assert_eq!(
            kinds(&a),
            ["user", "call", "call", "result", "result", "text"]
        );
        let strip = |t: &Transcript| {
            t.items
                .iter()
                .map(|i| (i.turn, i.kind.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&a), strip(&b));
        assert_eq!(strip(&a), strip(&c));
        assert_eq!(a.items[1].turn, 1);
        assert_eq!(a.items[5].turn, 2);
        // Lines point at the message each event came from.
        assert_eq!(a.items[3].line, 5);
        assert_eq!(b.items[3].line, 4);
    }

    #[test]
    fn anthropic_blocks() {
        let t = parse(
            r#"{"messages":[
{"role":"user","content":"fix it"},
{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Reading."},{"type":"tool_use","id":"t1","name":"read_file","input":{"path":"a.rs"}}]},
{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"no such file","is_error":true}]}
]}"#,
        )
        .unwrap();
        assert_eq!(kinds(&t), ["user", "text", "text", "call", "result"]);
        match &t.items[4].kind {
            Kind::Result { error, output, .. } => {
                assert!(*error);
                assert_eq!(output, "no such file");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.items[4].line, 4);
    }

    /// A user-role message right after tool results (or beside them) is the host's; one after
    /// the assistant spoke is a person's.
    #[test]
    fn user_text_right_after_tool_results_is_the_hosts() {
        let t = parse(
            r#"[
{"role":"user","content":"fix it"},
{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
{"role":"tool","tool_call_id":"c1","content":"error"},
{"role":"user","content":"Observation: error"},
{"role":"assistant","content":"It failed."},
{"role":"user","content":"we are going in circles"},
{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"x"},{"type":"text","text":"<system-reminder>todo</system-reminder>"}]}
]"#,
        )
        .unwrap();
        let users: Vec<bool> = t
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::User { injected, .. } => Some(*injected),
                _ => None,
            })
            .collect();
        assert_eq!(users, [false, true, false, true]);
    }

    #[test]
    fn bad_messages_name_their_line() {
        let e = parse("[\n{\"role\":\"user\",\"content\":\"x\"},\n{\"role\":\"robot\"}\n]")
            .unwrap_err();
        assert_eq!(e.line, 3);
        let e =
            parse("[\n{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}\n]").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("tool_calls[0]"));
        assert!(parse("").is_err());
        assert!(parse("hello").is_err());
        assert!(parse("[1, 2").is_err());
    }

    const RESPONSES_ITEMS: &[&str] = &[
        r#"{"role":"user","content":"list files"}"#,
        r#"{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"look"}]}"#,
        r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Listing."}]}"#,
        r#"{"type":"function_call","call_id":"c1","name":"ls","arguments":"{}"}"#,
        r#"{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch"}"#,
        r#"{"type":"local_shell_call","call_id":"c3","action":{"type":"exec","command":["ls","-la"]}}"#,
        r#"{"type":"function_call_output","call_id":"c1","output":"a b"}"#,
        r#"{"type":"custom_tool_call_output","call_id":"c2","output":[{"type":"input_text","text":"Done"}]}"#,
        r#"{"type":"local_shell_call_output","call_id":"c3","output":"total 0"}"#,
        r#"{"type":"message","role":"assistant","content":"done"}"#,
    ];

    fn strip(t: &Transcript) -> Vec<(u64, Kind)> {
        t.items.iter().map(|i| (i.turn, i.kind.clone())).collect()
    }

    #[test]
    fn responses_items_in_every_shape_read_the_same() {
        let items = RESPONSES_ITEMS;
        let array = format!("[\n{}\n]", items.join(",\n"));
        let jsonl = items.join("\n");
        let request = format!("{{\"model\":\"m\",\"input\":[\n{}\n]}}", items.join(",\n"));
        let record = format!(
            "{{\"input\":[\n{}\n],\n\"output\":[\n{}\n]}}",
            items[..9].join(",\n"),
            items[9]
        );
        let rollout: String = std::iter::once(
            r#"{"timestamp":"2025-09-01T10:00:00Z","type":"session_meta","payload":{"id":"s"}}"#
                .to_owned(),
        )
        .chain(
            items
                .iter()
                .map(|i| format!(r#"{{"type":"response_item","payload":{i}}}"#)),
        )
        .chain([r#"{"type":"event_msg","payload":{"type":"token_count"}}"#.to_owned()])
        .collect::<Vec<_>>()
        .join("\n");
        let a = parse(&array).unwrap();
        assert_eq!(
            kinds(&a),
            [
                "user", "text", "text", "call", "call", "call", "result", "result", "result",
                "text"
            ]
        );
        for text in [&jsonl, &request, &record, &rollout] {
            let t = parse(text).unwrap();
            assert_eq!(t.format, Format::Messages);
            assert_eq!(strip(&t), strip(&a), "{text}");
        }
        // The custom tool's raw input and the shell call's action are the arguments.
        assert!(
            matches!(&a.items[4].kind, Kind::Call { tool, arguments: Args::Raw(r), .. } if tool == "apply_patch" && r == "*** Begin Patch")
        );
        assert!(
            matches!(&a.items[5].kind, Kind::Call { tool, arguments: Args::Json(v), .. } if tool == "local_shell" && v["command"][1] == "-la")
        );
        assert!(matches!(&a.items[7].kind, Kind::Result { output, .. } if output == "Done"));
        // Results keep their own lines; the rollout's lines count its first line.
        assert_eq!(a.items[6].line, 8);
        assert_eq!(parse(&rollout).unwrap().items[6].line, 8);
        // A response object alone: its output items.
        let response = format!(
            "{{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[{},{}]}}",
            items[2], items[3]
        );
        assert_eq!(kinds(&parse(&response).unwrap()), ["text", "call"]);
    }

    #[test]
    fn an_unpaired_responses_output_is_kept_as_a_result() {
        let t = parse(
            "[{\"type\":\"function_call_output\",\"call_id\":\"gone\",\"output\":\"x\"},\n{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"ls\",\"arguments\":\"{}\"}]",
        )
        .unwrap();
        assert_eq!(kinds(&t), ["result", "call"]);
        assert!(matches!(&t.items[0].kind, Kind::Result { id, .. } if id == "gone"));
    }

    #[test]
    fn malformed_responses_items_name_their_line() {
        let ok = r#"{"type":"message","role":"user","content":"go"}"#;
        for (bad, needle) in [
            (
                r#"{"type":"function_call","call_id":"c","arguments":"{}"}"#,
                "needs a string `name`",
            ),
            (
                r#"{"type":"function_call","call_id":7,"name":"ls"}"#,
                "needs a string `call_id`",
            ),
            (
                r#"{"type":"function_call","call_id":"c","name":"ls","arguments":[1]}"#,
                "must be JSON text",
            ),
            (
                r#"{"type":"custom_tool_call","call_id":"c","name":"p","input":{"a":1}}"#,
                "needs a string `input`",
            ),
            (
                r#"{"type":"local_shell_call","call_id":"c"}"#,
                "needs an `action` object",
            ),
            (
                r#"{"type":"local_shell_call","call_id":"c","action":{"command":3}}"#,
                "`action.command`",
            ),
            (
                r#"{"type":"function_call_output","output":"x"}"#,
                "needs a string `id`",
            ),
            (
                r#"{"type":"function_call_output","call_id":"c","output":5}"#,
                "`output` must be",
            ),
            (
                r#"{"type":"message","role":"assistant","content":5}"#,
                "`content` must be",
            ),
            (
                r#"{"type":"message","role":"robot","content":"x"}"#,
                "unknown role `robot`",
            ),
            (r#"{"type":"computer_says_no"}"#, "unknown input item type"),
            ("7", "must be a JSON object"),
        ] {
            // The bad item follows an assistant item, so it is not the first of a run.
            let text = format!(
                "[\n{ok},\n{{\"type\":\"function_call\",\"call_id\":\"c0\",\"name\":\"ls\",\"arguments\":\"{{}}\"}},\n{bad}\n]"
            );
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 4, "{bad}: {e:?}");
            assert!(e.message.contains(needle), "{bad}: {}", e.message);
        }
        let e = parse("{\"type\":\"session_meta\",\"payload\":{}}\n{\"type\":\"response_item\",\"payload\":3}\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("`payload` object"), "{}", e.message);
    }

    #[test]
    fn deep_and_long_responses_items_stay_bounded() {
        let deep = format!(
            "{{\"input\":[{{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"a\",\"arguments\":{}1{}}}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse(&deep).is_err());
        let n = 20_000;
        let mut text = String::new();
        for i in 0..n {
            text.push_str(&format!(
                "{{\"type\":\"function_call\",\"call_id\":\"c{i}\",\"name\":\"ls\",\"arguments\":\"{{}}\"}}\n{{\"type\":\"function_call_output\",\"call_id\":\"x{i}\",\"output\":\"\"}}\n"
            ));
        }
        let start = std::time::Instant::now();
        assert_eq!(parse(&text).unwrap().items.len(), 2 * n);
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn event_turns_group_consecutive_calls() {
        let t = parse(
            "{\"type\":\"user\",\"text\":\"go\"}\n{\"type\":\"call\",\"tool\":\"a\"}\n{\"type\":\"call\",\"tool\":\"b\"}\n{\"type\":\"result\"}\n{\"type\":\"call\",\"tool\":\"c\"}\n{\"type\":\"text\",\"text\":\"x\"}\n",
        )
        .unwrap();
        let turns: Vec<u64> = t.items.iter().map(|i| i.turn).collect();
        assert_eq!(turns, [0, 1, 1, 1, 2, 3]);
    }
}
