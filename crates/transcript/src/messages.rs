//! Conversations as chat APIs carry them, read into events: OpenAI chat-completions messages,
//! Anthropic Messages (`tool_use` / `tool_result` content blocks) and OpenAI Responses input
//! items (`message`, `function_call`, `function_call_output`, `reasoning`, …).
//!
//! One set of semantics for every format, shared by `loopctl simulate`, `loopctl test`, the
//! proxy and the Python package:
//!
//! - an assistant message is one turn: its reasoning, then its text (marked as narration when
//!   calls come with it), then its calls in order; a run of Responses output items (a message,
//!   reasoning, function calls) is one assistant message;
//! - a tool result answers the call whose id it names (a legacy `function` result, the latest
//!   call);
//! - user-role text beside tool results, or right after them, is the host's (a framework's
//!   observation, a reminder, a "continue" prompt), not a person's: it is `injected`;
//! - an assistant message without calls whose text makes one in a form agents without native
//!   tool calling write (ReAct, XML tool use, code or shell actions: `text_calls.rs`) makes that
//!   call, and the user message after it is the call's result.
//!
//! [`Mode::Strict`] (recorded files) refuses what it does not know, naming the line;
//! [`Mode::Lenient`] (live traffic, where APIs grow new block and item types) passes over it.

use serde_json::{Map, Value, json};

use crate::{Args, BadInput, Clock, DEFAULT_SESSION, Fields, Item, Kind, Line, text_calls};

/// How a reader treats roles, block types and item types it does not know, and messages it
/// cannot read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every unknown or malformed part is an error naming its line (recorded transcripts: a
    /// typo never silently changes a replay).
    Strict,
    /// Unknown parts are passed over and a malformed message is skipped (live requests: the
    /// upstream judges their shape).
    Lenient,
}

/// Reads a list of chat messages (OpenAI or Anthropic shapes, mixed freely); each event's
/// `line` is its message's 1-based position in the list.
pub fn read_messages(messages: &[Value], mode: Mode) -> Result<Vec<Item>, BadInput> {
    let mut reader = Reader::new(mode);
    for (i, m) in messages.iter().enumerate() {
        reader.message(i + 1, m)?;
    }
    Ok(reader.finish())
}

/// Reads Gemini `contents` (a `generateContent` request's conversation, see the Gemini
/// format), each with its line: consecutive `model` contents are one answer, calls without an
/// `id` get synthetic ones and responses pair with calls by `id`, else by name and order.
pub fn read_gemini_contents(
    contents: &[(Line, &Value)],
    mode: Mode,
) -> Result<Vec<Item>, BadInput> {
    crate::gemini::read_with(contents, mode, true)
}

/// Reads the `input` of an OpenAI Responses request: a string (one user message) or a list of
/// items; each event's `line` is its item's 1-based position (a run of output items read as
/// one assistant message takes the position of its first item).
pub fn read_responses_input(input: &Value, mode: Mode) -> Result<Vec<Item>, BadInput> {
    let mut reader = Reader::new(mode);
    match input {
        Value::String(s) => reader.message(1, &json!({"role": "user", "content": s}))?,
        Value::Array(items) => {
            let positioned: Vec<(Line, &Value)> =
                items.iter().enumerate().map(|(i, v)| (i + 1, v)).collect();
            return read_responses_items(&positioned, mode);
        }
        Value::Null => {}
        _ => {
            if mode == Mode::Strict {
                return Err(BadInput::at(
                    1,
                    "`input` must be a string or a list of items",
                ));
            }
        }
    }
    Ok(reader.finish())
}

/// Whether a message or Responses item was written by the assistant (the model's side of the
/// conversation): an `assistant` message, or a function call, reasoning or other output item.
pub fn is_assistant(message: &Value) -> bool {
    match message.get("type").and_then(Value::as_str) {
        None | Some("message") => message.get("role").and_then(Value::as_str) == Some("assistant"),
        Some(ty) => is_model_item(ty),
    }
}

/// Whether a Responses item type is one the model writes besides its messages: a call,
/// reasoning, or a call of a built-in tool the server runs.
pub fn is_model_item(ty: &str) -> bool {
    ASSISTANT_ITEMS.contains(&ty) || SKIPPED_OUTPUT_ITEMS.contains(&ty)
}

/// Whether a Responses item type answers a call the host ran (`function_call_output` and its
/// kin).
pub fn is_output_item(ty: &str) -> bool {
    OUTPUT_ITEMS.contains(&ty)
}

/// A Responses call item (`function_call`, `custom_tool_call`, `local_shell_call`) read as a
/// call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResponsesCall<'a> {
    /// `call_id`, or the item's `id` when it has none.
    pub id: Option<&'a Value>,
    /// The tool's name; `local_shell` for a shell call.
    pub name: &'a str,
    /// The arguments: a function call's `arguments` (text or, leniently, a JSON value), a
    /// custom tool's `input` text, a shell call's `action`.
    pub arguments: Option<&'a Value>,
}

/// Reads a Responses call item; `None` for any other item.
pub fn responses_call(item: &Map<String, Value>) -> Option<ResponsesCall<'_>> {
    let name = || item.get("name").and_then(Value::as_str).unwrap_or_default();
    let (name, arguments) = match item.get("type").and_then(Value::as_str)? {
        "function_call" => (name(), item.get("arguments")),
        "custom_tool_call" => (name(), item.get("input").filter(|v| v.is_string())),
        "local_shell_call" => ("local_shell", item.get("action")),
        _ => return None,
    };
    Some(ResponsesCall {
        id: item.get("call_id").or_else(|| item.get("id")),
        name,
        arguments,
    })
}

/// Responses item types the model writes that become calls, text or reasoning.
const ASSISTANT_ITEMS: &[&str] = &[
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "computer_call",
    "reasoning",
];

/// Responses output items of built-in tools run by the server (no host result follows them).
const SKIPPED_OUTPUT_ITEMS: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
];

/// Responses input items that carry nothing the engine reads.
const SKIPPED_INPUT_ITEMS: &[&str] = &[
    "item_reference",
    "computer_call_output",
    "mcp_approval_response",
];

/// Whether a list element is a Responses item rather than a chat message or a loopguard event:
/// its `type` is one of the Responses item types.
pub(crate) fn is_responses_item(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str).is_some_and(|t| {
        t == "message" || is_output_item(t) || is_model_item(t) || SKIPPED_INPUT_ITEMS.contains(&t)
    })
}

/// Responses items that answer a call.
const OUTPUT_ITEMS: &[&str] = &[
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
];

/// Reads Responses items, each with its line (a run of output items read as one assistant
/// message takes the line of its first item).
pub fn read_responses_items(items: &[(Line, &Value)], mode: Mode) -> Result<Vec<Item>, BadInput> {
    let mut reader = Reader::new(mode);
    for (line, message) in responses_messages(items, mode)? {
        reader.message(line, &message)?;
    }
    Ok(reader.finish())
}

/// Rewrites Responses items as chat messages (with their positions): a run of output items is
/// one assistant message, each output of a call is a `tool` message, and every other message
/// item is a message of its role.
fn responses_messages(
    items: &[(Line, &Value)],
    mode: Mode,
) -> Result<Vec<(Line, Value)>, BadInput> {
    let mut out = Vec::new();
    let mut run: Option<AssistantRun> = None;
    for &(line, item) in items {
        let Value::Object(obj) = item else {
            if mode == Mode::Strict {
                return Err(BadInput::at(line, "an input item must be a JSON object"));
            }
            continue;
        };
        let ty = obj.get("type").and_then(Value::as_str);
        let role = obj.get("role").and_then(Value::as_str);
        let assistant_side = match ty {
            None | Some("message") => role == Some("assistant"),
            Some(t) => is_model_item(t),
        };
        if !assistant_side && let Some(r) = run.take() {
            out.push(r.into_message());
        }
        if mode == Mode::Strict {
            check_item(line, obj, ty)?;
        }
        if assistant_side {
            let r = run.get_or_insert_with(|| AssistantRun::new(line));
            r.add(obj, ty.unwrap_or("message"));
            continue;
        }
        match ty {
            None | Some("message") => out.push((line, item.clone())),
            Some(t) if OUTPUT_ITEMS.contains(&t) => {
                let id = obj
                    .get("call_id")
                    .or_else(|| obj.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let output = obj.get("output").cloned().unwrap_or(Value::Null);
                let mut m = json!({"role": "tool", "tool_call_id": id, "content": output});
                if obj.get("status").and_then(Value::as_str) == Some("incomplete") {
                    m["is_error"] = json!(true);
                }
                out.push((line, m));
            }
            // The screenshot a computer-use host took after an action: one image part.
            Some("computer_call_output") => {
                let id = obj
                    .get("call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let output = match obj.get("output") {
                    Some(o @ Value::Object(_)) => json!([o]),
                    Some(o) => o.clone(),
                    None => Value::Null,
                };
                out.push((
                    line,
                    json!({"role": "tool", "tool_call_id": id, "content": output}),
                ));
            }
            Some(t) if SKIPPED_INPUT_ITEMS.contains(&t) => {}
            Some(other) => {
                if mode == Mode::Strict {
                    return Err(BadInput::at(
                        line,
                        format!("unknown input item type `{other}`"),
                    ));
                }
            }
        }
    }
    if let Some(r) = run {
        out.push(r.into_message());
    }
    Ok(out)
}

/// Checks the fields of a Responses item that a recording must get right, at the item's own
/// line (a run of output items is read as one message at the line of its first).
fn check_item(line: Line, obj: &Map<String, Value>, ty: Option<&str>) -> Result<(), BadInput> {
    let Some(ty) = ty else { return Ok(()) };
    let string = |key: &str, required: bool| match obj.get(key) {
        Some(Value::String(_)) => Ok(()),
        None | Some(Value::Null) if !required => Ok(()),
        _ => Err(BadInput::at(
            line,
            format!("a `{ty}` item needs a string `{key}`"),
        )),
    };
    match ty {
        "message" => match obj.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => Ok(()),
            Some(_) => Err(BadInput::at(
                line,
                "a `message` item's `content` must be a string or an array of content parts",
            )),
        },
        "function_call" | "custom_tool_call" => {
            string("name", true)?;
            if obj.get("call_id").is_some() {
                string("call_id", true)?;
            } else {
                string("id", false)?;
            }
            if ty == "custom_tool_call" {
                string("input", false)
            } else {
                match obj.get("arguments") {
                    Some(Value::Array(_) | Value::Number(_) | Value::Bool(_)) => Err(BadInput::at(
                        line,
                        "a `function_call` item's `arguments` must be JSON text",
                    )),
                    _ => Ok(()),
                }
            }
        }
        "local_shell_call" => {
            string("call_id", false)?;
            match obj.get("action") {
                Some(Value::Object(action)) => match action.get("command") {
                    None | Some(Value::Array(_) | Value::String(_)) => Ok(()),
                    Some(_) => Err(BadInput::at(
                        line,
                        "a `local_shell_call` item's `action.command` must be a list of words",
                    )),
                },
                _ => Err(BadInput::at(
                    line,
                    "a `local_shell_call` item needs an `action` object",
                )),
            }
        }
        t if OUTPUT_ITEMS.contains(&t) => {
            if obj.get("call_id").is_some() {
                string("call_id", true)?;
            } else {
                string("id", true)?;
            }
            match obj.get("output") {
                None | Some(Value::Null | Value::String(_) | Value::Array(_)) => Ok(()),
                Some(_) => Err(BadInput::at(
                    line,
                    format!(
                        "a `{ty}` item's `output` must be a string or an array of content parts"
                    ),
                )),
            }
        }
        _ => Ok(()),
    }
}

/// Output items of one model turn, gathered into one assistant message.
struct AssistantRun {
    line: Line,
    content: Vec<Value>,
    calls: Vec<Value>,
    reasoning: Vec<String>,
}

impl AssistantRun {
    fn new(line: Line) -> AssistantRun {
        AssistantRun {
            line,
            content: Vec::new(),
            calls: Vec::new(),
            reasoning: Vec::new(),
        }
    }

    fn add(&mut self, obj: &Map<String, Value>, ty: &str) {
        match ty {
            "message" => match obj.get("content") {
                Some(Value::Array(parts)) => self.content.extend(parts.iter().cloned()),
                Some(Value::String(s)) => self.content.push(json!({"type": "text", "text": s})),
                _ => {}
            },
            // A computer-use action (OpenAI's `computer_call`), run by the host: a call of the
            // `computer` tool whose `action` names what it does, as Anthropic's computer tool
            // has it (`{"action": "click", "x": 10, "y": 20}`).
            "computer_call" => {
                let mut action = match obj.get("action") {
                    Some(Value::Object(a)) => a.clone(),
                    _ => Map::new(),
                };
                if let Some(kind) = action.remove("type") {
                    action.insert("action".into(), kind);
                }
                self.calls.push(json!({
                    "id": obj.get("call_id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": "computer", "arguments": Value::Object(action)},
                }));
            }
            "function_call" | "custom_tool_call" | "local_shell_call" => {
                if let Some(call) = responses_call(obj) {
                    self.calls.push(json!({
                        "id": call.id.cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments.cloned().unwrap_or(Value::Null)},
                    }));
                }
            }
            "reasoning" => {
                for part in ["summary", "content"] {
                    if let Some(Value::Array(parts)) = obj.get(part) {
                        self.reasoning.extend(
                            parts
                                .iter()
                                .filter_map(|p| p.get("text").and_then(Value::as_str))
                                .map(str::to_owned),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    fn into_message(self) -> (Line, Value) {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.calls.is_empty() {
            m["tool_calls"] = Value::Array(self.calls);
        }
        if !self.reasoning.is_empty() {
            m["reasoning"] = Value::String(self.reasoning.join("\n"));
        }
        (self.line, m)
    }
}

type CallParts = (Option<String>, String, Args);

/// Reads messages one at a time, keeping what the next one needs: the turn, the clock, the
/// latest call (which a legacy `function` result answers).
pub(crate) struct Reader {
    mode: Mode,
    items: Vec<Item>,
    clock: Clock,
    turn: u64,
    synthetic_ids: u64,
    latest_call: Option<String>,
    /// A call the previous message made in its text, which the next user message answers.
    text_call: Option<TextPending>,
}

/// A call read from an assistant's text, waiting for the message after it.
enum TextPending {
    /// Made (the form was plain): the next user message is its result.
    Made { id: String },
    /// A shell block, made only if the next user message is an observation: the call, and the
    /// index of the text item that becomes narration then.
    IfObserved {
        line: Line,
        time: Option<f64>,
        tool: String,
        arguments: serde_json::Value,
        text_item: usize,
    },
}

impl Reader {
    pub(crate) fn new(mode: Mode) -> Reader {
        Reader {
            mode,
            items: Vec::new(),
            clock: Clock::default(),
            turn: 0,
            synthetic_ids: 0,
            latest_call: None,
            text_call: None,
        }
    }

    pub(crate) fn finish(self) -> Vec<Item> {
        self.items
    }

    /// Reads one message; in lenient mode a message that cannot be read adds nothing.
    pub(crate) fn message(&mut self, line: Line, msg: &Value) -> Result<(), BadInput> {
        let before = self.items.len();
        let (turn, clock) = (self.turn, self.clock.last_ms);
        match self.read(line, msg) {
            Ok(()) => Ok(()),
            Err(e) if self.mode == Mode::Lenient => {
                self.items.truncate(before);
                self.turn = turn;
                self.clock.last_ms = clock;
                let _ = e;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn push(&mut self, line: Line, time: Option<f64>, kind: Kind) {
        // A message's events after its first are placed one second apart.
        let time_ms = self
            .clock
            .next(if self.items.last().is_some_and(|i| i.line == line) {
                None
            } else {
                time
            });
        self.items.push(Item {
            line,
            session: DEFAULT_SESSION.to_owned(),
            time_ms,
            turn: self.turn,
            kind,
        });
    }

    fn read(&mut self, line: Line, msg: &Value) -> Result<(), BadInput> {
        let Value::Object(obj) = msg else {
            return Err(BadInput::at(line, "a message must be a JSON object"));
        };
        let f = Fields { obj, line };
        let role = f
            .string("role")?
            .ok_or_else(|| BadInput::at(line, "the message has no `role`"))?;
        let time = f.seconds("time")?;
        let pending = self.text_call.take();
        match role.as_str() {
            "system" | "developer" => {
                // AutoGPT answers a command in the system role: `Command X returned: …`.
                if let Some(TextPending::Made { id }) = &pending
                    && let Some(text) = obj.get("content").and_then(Value::as_str)
                    && text.starts_with("Command ")
                    && text.lines().next().is_some_and(|l| l.contains(" returned"))
                {
                    let id = id.clone();
                    self.push(
                        line,
                        time,
                        Kind::Result {
                            id,
                            output: text.to_owned(),
                            error: false,
                            exit_code: None,
                        },
                    );
                } else {
                    // Anything else in the system role stands between a call and its answer.
                    self.text_call = pending;
                }
            }
            "assistant" => self.assistant(line, time, obj)?,
            // smolagents' memory: a step's calls as `Calling tools: [<repr of dicts>]`, after
            // the assistant's own message (which already made a code action's call).
            "tool-call" => {
                let content = obj.get("content").unwrap_or(&Value::Null);
                let mut texts = Vec::new();
                self.content(
                    content,
                    line,
                    &mut texts,
                    &mut Vec::new(),
                    &mut Vec::new(),
                    None,
                )?;
                if pending.is_some() {
                    self.text_call = pending;
                } else {
                    self.recorded_calls(line, time, &texts.join("\n"))?;
                }
            }
            "tool" | "function" => {
                let id = match f.string("tool_call_id")? {
                    Some(id) => id,
                    // Legacy `function` results answer the latest call without an id.
                    None => self.latest_call.clone().ok_or_else(|| {
                        BadInput::at(line, "a tool message needs a `tool_call_id`")
                    })?,
                };
                let output = content_text(obj.get("content").unwrap_or(&Value::Null), line)?;
                let error = f.boolean("is_error")?.unwrap_or(false);
                self.push(
                    line,
                    time,
                    Kind::Result {
                        id,
                        output,
                        error,
                        exit_code: None,
                    },
                );
            }
            // smolagents' memory: a step's observation (`Call id: …\nObservation: …`).
            "user" | "tool-response" => {
                let content = obj.get("content").unwrap_or(&Value::Null);
                let mut texts = Vec::new();
                let mut results = Vec::new();
                self.content(
                    content,
                    line,
                    &mut texts,
                    &mut Vec::new(),
                    &mut Vec::new(),
                    Some(&mut results),
                )?;
                // A person's message comes after the assistant spoke; one that follows tool
                // results directly was appended by the host before asking the model again.
                let after_results = !results.is_empty()
                    || matches!(
                        self.items.last(),
                        Some(Item {
                            kind: Kind::Result { .. },
                            ..
                        })
                    );
                let answered = !results.is_empty();
                for (id, output, error) in results {
                    self.push(
                        line,
                        time,
                        Kind::Result {
                            id,
                            output,
                            error,
                            exit_code: None,
                        },
                    );
                }
                let text = texts.join("\n");
                if !answered
                    && let Some(pending) = pending
                    && let Some(id) = self.answer_text_call(pending, &text)
                {
                    let output = text_calls::observation_body(&text).to_owned();
                    self.push(
                        line,
                        time,
                        Kind::Result {
                            id,
                            output,
                            error: false,
                            exit_code: None,
                        },
                    );
                    return Ok(());
                }
                if !text.trim().is_empty() {
                    // Text beside or right after tool results is the host's (a reminder, an
                    // observation, a "continue" prompt), not a person's.
                    let injected = after_results || role == "tool-response";
                    self.push(line, time, Kind::User { text, injected });
                }
            }
            other => {
                return Err(BadInput::at(
                    line,
                    format!(
                        "unknown role `{other}`; expected system, developer, user, assistant, tool, or smolagents' tool-call and tool-response"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn assistant(
        &mut self,
        line: Line,
        time: Option<f64>,
        obj: &Map<String, Value>,
    ) -> Result<(), BadInput> {
        let content = obj.get("content").unwrap_or(&Value::Null);
        let mut texts = Vec::new();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for key in ["reasoning_content", "reasoning"] {
            if let Some(Value::String(s)) = obj.get(key) {
                reasoning.push(s.clone());
            }
        }
        self.content(content, line, &mut texts, &mut calls, &mut reasoning, None)?;
        if let Some(tc) = obj.get("tool_calls").filter(|v| !v.is_null()) {
            let Value::Array(tc) = tc else {
                return Err(BadInput::at(line, "`tool_calls` must be an array"));
            };
            for (k, call) in tc.iter().enumerate() {
                calls.push(openai_call(call, line, k)?);
            }
        }
        if let Some(fc) = obj.get("function_call").filter(|v| !v.is_null()) {
            calls.push(legacy_function_call(fc, line)?);
        }
        self.turn += 1;
        let mut if_observed = None;
        let from_text = calls.is_empty();
        let mut text = texts.join("\n");
        if from_text && let Some(tc) = text_calls::text_call(&text) {
            if tc.sure {
                calls.push((None, tc.tool, Args::Json(tc.arguments)));
                // The call's own text (a tool use's parameters, a file's content) is no prose.
                if text.is_char_boundary(tc.prose) {
                    text.truncate(tc.prose);
                }
            } else {
                if_observed = Some((tc.tool, tc.arguments));
            }
        }
        let reasoned = reasoning.iter().any(|r| !r.trim().is_empty());
        for r in reasoning.into_iter().filter(|r| !r.trim().is_empty()) {
            self.push(
                line,
                time,
                Kind::Text {
                    text: r,
                    chunk: false,
                    end: false,
                    reasoning: true,
                    narration: false,
                },
            );
        }
        // A turn of reasoning alone is not an empty turn: it says nothing yet.
        if (calls.is_empty() && !reasoned) || !text.trim().is_empty() {
            self.push(
                line,
                time,
                Kind::Text {
                    text,
                    chunk: false,
                    end: false,
                    reasoning: false,
                    narration: !calls.is_empty(),
                },
            );
        }
        if let Some((tool, arguments)) = if_observed
            && let Some(text_item) = self.items.len().checked_sub(1)
        {
            self.text_call = Some(TextPending::IfObserved {
                line,
                time,
                tool,
                arguments,
                text_item,
            });
        }
        let made_in_text = from_text && !calls.is_empty();
        for (id, tool, arguments) in calls {
            let id = id.unwrap_or_else(|| {
                self.synthetic_ids += 1;
                format!("call_{}", self.synthetic_ids)
            });
            self.latest_call = Some(id.clone());
            if made_in_text {
                self.text_call = Some(TextPending::Made { id: id.clone() });
            }
            self.push(
                line,
                time,
                Kind::Call {
                    id,
                    tool,
                    arguments,
                },
            );
        }
        Ok(())
    }

    /// The calls a smolagents `tool-call` message records (`Calling tools:` and the `repr` of a
    /// list of `{'id', 'type', 'function': {'name', 'arguments'}}` dicts); the next
    /// `tool-response` answers the last of them. A text in no such form makes no call.
    fn recorded_calls(
        &mut self,
        line: Line,
        time: Option<f64>,
        text: &str,
    ) -> Result<(), BadInput> {
        let t = text.trim();
        let list = t.strip_prefix("Calling tools:").map_or(t, str::trim_start);
        let Some(Value::Array(calls)) = crate::py_literal::parse(list) else {
            if self.mode == Mode::Strict && t.starts_with("Calling tools:") {
                return Err(BadInput::at(
                    line,
                    "a `tool-call` message's `Calling tools:` list could not be read as a Python literal",
                ));
            }
            return Ok(());
        };
        // The step's own assistant message, if it wrote one, opened the turn.
        if !matches!(
            self.items.last(),
            Some(Item {
                kind: Kind::Text {
                    reasoning: false,
                    ..
                },
                ..
            })
        ) {
            self.turn += 1;
        }
        for call in &calls {
            let f = call.get("function").unwrap_or(call);
            let Some(tool) = f.get("name").and_then(Value::as_str) else {
                continue;
            };
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({ "input": s })),
                Some(v @ Value::Object(_)) => v.clone(),
                Some(Value::Null) | None => json!({}),
                Some(other) => json!({ "input": other }),
            };
            let id = match call.get("id").and_then(Value::as_str) {
                Some(id) => id.to_owned(),
                None => {
                    self.synthetic_ids += 1;
                    format!("call_{}", self.synthetic_ids)
                }
            };
            self.latest_call = Some(id.clone());
            self.text_call = Some(TextPending::Made { id: id.clone() });
            self.push(
                line,
                time,
                Kind::Call {
                    id,
                    tool: tool.to_owned(),
                    arguments: Args::Json(arguments),
                },
            );
        }
        Ok(())
    }

    /// The id of the call a user message answers when the message before it made one in its
    /// text; a shell block's call is made here when the message is an observation.
    fn answer_text_call(&mut self, pending: TextPending, text: &str) -> Option<String> {
        match pending {
            TextPending::Made { id } => Some(id),
            TextPending::IfObserved {
                line,
                time,
                tool,
                arguments,
                text_item,
            } => {
                if !text_calls::is_observation(text) {
                    return None;
                }
                if let Some(Item {
                    kind: Kind::Text { narration, .. },
                    ..
                }) = self.items.get_mut(text_item)
                {
                    *narration = true;
                }
                self.synthetic_ids += 1;
                let id = format!("call_{}", self.synthetic_ids);
                self.latest_call = Some(id.clone());
                self.push(
                    line,
                    time,
                    Kind::Call {
                        id: id.clone(),
                        tool,
                        arguments: Args::Json(arguments),
                    },
                );
                Some(id)
            }
        }
    }

    /// Reads message content: a string, or an array of parts / blocks (OpenAI `text` parts,
    /// Responses `input_text` / `output_text` parts, Anthropic `text`, `thinking`, `tool_use`
    /// and `tool_result` blocks).
    fn content(
        &self,
        content: &Value,
        line: Line,
        texts: &mut Vec<String>,
        calls: &mut Vec<CallParts>,
        reasoning: &mut Vec<String>,
        mut results: Option<&mut Vec<(String, String, bool)>>,
    ) -> Result<(), BadInput> {
        match content {
            Value::Null => Ok(()),
            Value::String(s) => {
                texts.push(s.clone());
                Ok(())
            }
            Value::Array(parts) => {
                for (k, part) in parts.iter().enumerate() {
                    let ty = part.get("type").and_then(Value::as_str).unwrap_or("text");
                    let at = |what: &str| BadInput::at(line, format!("content block {k}: {what}"));
                    match ty {
                        "text" | "input_text" | "output_text" => {
                            let t = part
                                .get("text")
                                .and_then(Value::as_str)
                                .ok_or_else(|| at("a `text` block needs a string `text`"))?;
                            texts.push(t.to_owned());
                        }
                        "thinking" | "reasoning" => {
                            if let Some(t) = part
                                .get("thinking")
                                .or_else(|| part.get("text"))
                                .and_then(Value::as_str)
                            {
                                reasoning.push(t.to_owned());
                            }
                        }
                        "redacted_thinking"
                        | "image"
                        | "image_url"
                        | "input_image"
                        | "document"
                        | "input_audio"
                        | "input_file"
                        | "file"
                        | "refusal"
                        | "search_result"
                        | "web_search_tool_result"
                        | "container_upload" => {}
                        "tool_use" | "server_tool_use" => {
                            let id = part.get("id").and_then(Value::as_str).map(str::to_owned);
                            let name = part
                                .get("name")
                                .and_then(Value::as_str)
                                .ok_or_else(|| at("a `tool_use` block needs a string `name`"))?;
                            let input = match part.get("input") {
                                None | Some(Value::Null) => {
                                    Args::Json(Value::Object(Map::default()))
                                }
                                Some(Value::String(s)) => Args::from_text(s),
                                Some(v) => Args::Json(v.clone()),
                            };
                            calls.push((id, name.to_owned(), input));
                        }
                        "tool_result" => {
                            let Some(results) = results.as_deref_mut() else {
                                return Err(at("a `tool_result` block belongs in a user message"));
                            };
                            let id = part
                                .get("tool_use_id")
                                .and_then(Value::as_str)
                                .ok_or_else(|| at("a `tool_result` block needs a `tool_use_id`"))?;
                            let output =
                                content_text(part.get("content").unwrap_or(&Value::Null), line)?;
                            let error = match part.get("is_error") {
                                None | Some(Value::Null) => false,
                                Some(Value::Bool(b)) => *b,
                                Some(_) => return Err(at("`is_error` must be true or false")),
                            };
                            results.push((id.to_owned(), output, error));
                        }
                        other => {
                            if self.mode == Mode::Strict {
                                return Err(at(&format!("unknown content block type `{other}`")));
                            }
                        }
                    }
                }
                Ok(())
            }
            _ => Err(BadInput::at(
                line,
                "`content` must be a string, an array of content parts, or null",
            )),
        }
    }
}

/// The text of a tool result's content: a string, or the text parts of an array, with a line
/// standing for each part that is no text ([`attachment_line`]).
fn content_text(content: &Value, line: Line) -> Result<String, BadInput> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                _ => match p.get("text").and_then(Value::as_str) {
                    Some(t) => Some(t.to_owned()),
                    None => attachment_line(p),
                },
            })
            .collect::<Vec<_>>()
            .join("\n")),
        _ => Err(BadInput::at(
            line,
            "tool result `content` must be a string, an array of content parts, or null",
        )),
    }
}

/// Inline data shorter than this is a recording's placeholder or a shortened copy (the first
/// bytes of two images of one size are the same header), not an image one can compare.
const MIN_INLINE_DATA: usize = 256;

/// A line standing for a part of a tool result that is no text (a screenshot, a document,
/// audio, a file): its kind and a digest of its data. Two results showing the same image are
/// then the same outcome, and a changed image a changed outcome, as with text; a
/// browser or computer-use agent's screenshots are most of what its actions return.
///
/// The digest is written in the letters `g` to `z` alone, which no result masker takes for a
/// number, a hex id or an opaque id. A part whose data the recording left out or shortened
/// gives no line: what it showed is unknown, and the result is judged by its text alone.
fn attachment_line(part: &Value) -> Option<String> {
    let kind = match part.get("type").and_then(Value::as_str)? {
        "image" | "image_url" | "input_image" | "computer_screenshot" => "image",
        "document" | "file" | "input_file" => "file",
        "input_audio" | "audio" => "audio",
        _ => return None,
    };
    let at = |path: &[&str]| {
        path.iter()
            .try_fold(part, |v, k| v.get(*k))
            .and_then(Value::as_str)
    };
    // Inline data, or a reference (a URL, a file id) to data held elsewhere.
    let inline = at(&["source", "data"])
        .or_else(|| at(&["input_audio", "data"]))
        .or_else(|| at(&["file", "file_data"]))
        .or_else(|| at(&["file_data"]))
        .or_else(|| at(&["data"]));
    let url = at(&["image_url", "url"])
        .or_else(|| at(&["image_url"]))
        .or_else(|| at(&["source", "url"]));
    let reference = at(&["source", "file_id"])
        .or_else(|| at(&["file", "file_id"]))
        .or_else(|| at(&["file_id"]))
        .or_else(|| at(&["file_url"]));
    let data = match (inline, url) {
        (Some(d), _) => Some(d).filter(|d| whole_inline_data(d)),
        (None, Some(u)) if u.starts_with("data:") => Some(u).filter(|d| whole_inline_data(d)),
        (None, Some(u)) => Some(u).filter(|u| is_reference(u)),
        (None, None) => None,
    }
    .or_else(|| reference.filter(|r| is_reference(r)))?;
    let mut digest = loopguard_hash::hash_str(data);
    let mut letters = String::with_capacity(15);
    for _ in 0..15 {
        letters.push(char::from(b'g' + (digest % 20) as u8));
        digest /= 20;
    }
    Some(format!("[{kind} {letters}]"))
}

/// Inline data (base64, or a `data:` URL) that is whole: long enough to be more than a
/// header, and not cut short with an ellipsis.
fn whole_inline_data(d: &str) -> bool {
    let d = d.trim_end();
    d.len() >= MIN_INLINE_DATA && !d.ends_with("...") && !d.ends_with('…')
}

/// A URL or a file id naming data held elsewhere, not a placeholder sentence.
fn is_reference(r: &str) -> bool {
    r.len() >= 8
        && !r
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b == b'<' || b == b'[')
}

fn openai_call(call: &Value, line: Line, k: usize) -> Result<CallParts, BadInput> {
    let at = |what: &str| BadInput::at(line, format!("tool_calls[{k}]: {what}"));
    let Value::Object(obj) = call else {
        return Err(at("a tool call must be an object"));
    };
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(at("`id` must be a string")),
    };
    let function = obj
        .get("function")
        .ok_or_else(|| at("a tool call needs a `function`"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| at("`function.name` must be a string"))?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Args::Json(Value::Object(Map::default())),
        Some(Value::String(s)) => Args::from_text(s),
        Some(v) => Args::Json(v.clone()),
    };
    Ok((id, name.to_owned(), arguments))
}

fn legacy_function_call(fc: &Value, line: Line) -> Result<CallParts, BadInput> {
    let name = fc
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| BadInput::at(line, "`function_call.name` must be a string"))?;
    let arguments = match fc.get("arguments") {
        Some(Value::String(s)) => Args::from_text(s),
        None | Some(Value::Null) => Args::Json(Value::Object(Map::default())),
        Some(v) => Args::Json(v.clone()),
    };
    Ok((None, name.to_owned(), arguments))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn kinds(items: &[Item]) -> Vec<&'static str> {
        items.iter().map(|i| i.kind.name()).collect()
    }

    fn outputs(items: &[Item]) -> Vec<&str> {
        items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::Result { output, .. } => Some(output.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn responses_items_read_as_the_same_conversation_as_chat_messages() {
        let input = json!([
            {"role": "user", "content": "list files"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{\"path\":\"src\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a b"},
            {"type": "function_call_output", "call_id": "c2", "output": "c"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Observation: done"}]},
        ]);
        let items = read_responses_input(&input, Mode::Strict).unwrap();
        assert_eq!(
            kinds(&items),
            [
                "user", "text", "text", "call", "call", "result", "result", "user"
            ]
        );
        let chat = read_messages(
            &[
                json!({"role": "user", "content": "list files"}),
                json!({"role": "assistant", "reasoning": "look", "content": "Listing.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\"src\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "a b"}),
                json!({"role": "tool", "tool_call_id": "c2", "content": "c"}),
                json!({"role": "user", "content": "Observation: done"}),
            ],
            Mode::Strict,
        )
        .unwrap();
        let strip = |items: &[Item]| {
            items
                .iter()
                .map(|i| (i.turn, i.kind.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&items), strip(&chat));
        // The run of output items takes the first one's position; results keep their own.
        assert_eq!(items[1].line, 2);
        assert_eq!(items[5].line, 6);
        assert!(matches!(&items[7].kind, Kind::User { injected: true, .. }));
    }

    /// The output of the one result in `messages`.
    fn result_output(messages: &[Value]) -> String {
        read_messages(messages, Mode::Strict)
            .unwrap()
            .into_iter()
            .find_map(|i| match i.kind {
                Kind::Result { output, .. } => Some(output),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn images_in_results_are_compared_by_their_data() {
        let screenshot = |data: &str| {
            result_output(&[
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "computer", "input": {"action": "screenshot"}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "Took a screenshot."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]}),
            ])
        };
        let a = "iVBORw0KGgo".to_owned() + &"A1b2".repeat(80);
        let b = "iVBORw0KGgo".to_owned() + &"C3d4".repeat(80);
        let (ta, tb) = (screenshot(&a), screenshot(&b));
        assert_eq!(ta, screenshot(&a));
        assert_ne!(ta, tb);
        let line = ta.strip_prefix("Took a screenshot.\n[image ").unwrap();
        let letters = line.strip_suffix(']').unwrap();
        assert!(letters.len() == 15 && letters.bytes().all(|c| (b'g'..=b'z').contains(&c)));
        // Data left out or cut short by the recording: what the image showed is unknown.
        for elided in [
            "",
            "<image omitted>",
            "iVBORw0KGgoAAAANSUhEUgAA",
            &(a[..300].to_owned() + "..."),
        ] {
            assert_eq!(screenshot(elided), "Took a screenshot.", "{elided}");
        }
        // The same in a chat tool message (a data URL) and by reference.
        let chat = |part: Value| {
            result_output(&[
                json!({"role": "assistant", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "browser_take_screenshot", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": [part]}),
            ])
        };
        let url = format!("data:image/png;base64,{a}");
        let by_url = chat(json!({"type": "image_url", "image_url": {"url": url}}));
        assert!(by_url.starts_with("[image "));
        assert_eq!(
            by_url,
            chat(json!({"type": "image_url", "image_url": {"url": url}}))
        );
        assert_ne!(
            chat(json!({"type": "input_image", "file_id": "file-6F2ksmvXxt4VdHZa"})),
            chat(json!({"type": "input_image", "file_id": "file-8Hq3ZtLwPp1mNcVb"}))
        );
    }

    #[test]
    fn computer_use_actions_are_calls_of_the_computer_tool() {
        let shot = |tag: &str| {
            json!({"type": "computer_screenshot",
                   "image_url": format!("data:image/png;base64,{}", tag.repeat(100))})
        };
        let input = json!([
            {"role": "user", "content": "open the settings"},
            {"type": "computer_call", "id": "cu_1", "call_id": "c1", "status": "completed",
             "action": {"type": "screenshot"}, "pending_safety_checks": []},
            {"type": "computer_call_output", "call_id": "c1", "output": shot("AAAA")},
            {"type": "computer_call", "id": "cu_2", "call_id": "c2", "status": "completed",
             "action": {"type": "click", "button": "left", "x": 10, "y": 20}, "pending_safety_checks": []},
            {"type": "computer_call_output", "call_id": "c2", "output": shot("BBBB")},
        ]);
        let items = read_responses_input(&input, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["user", "call", "result", "call", "result"]);
        let Kind::Call {
            tool, arguments, ..
        } = &items[3].kind
        else {
            panic!("{:?}", items[3]);
        };
        assert_eq!(tool, "computer");
        assert_eq!(
            arguments,
            &Args::Json(json!({"action": "click", "button": "left", "x": 10, "y": 20}))
        );
        let outputs = outputs(&items);
        assert!(
            outputs.iter().all(|o| o.starts_with("[image ")),
            "{outputs:?}"
        );
        assert_ne!(outputs[0], outputs[1]);
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let items = read_responses_input(&json!("fix the build"), Mode::Strict).unwrap();
        assert!(
            matches!(&items[0].kind, Kind::User { text, injected: false } if text == "fix the build")
        );
    }

    #[test]
    fn lenient_reading_passes_over_what_it_does_not_know() {
        let messages = [
            json!({"role": "user", "content": [{"type": "mystery_block", "x": 1}, {"type": "text", "text": "go"}]}),
            json!({"role": "robot", "content": "beep"}),
            json!({"role": "assistant", "tool_calls": "not a list"}),
            json!({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}]}),
        ];
        assert!(read_messages(&messages, Mode::Strict).is_err());
        let items = read_messages(&messages, Mode::Lenient).unwrap();
        assert_eq!(kinds(&items), ["user", "call"]);
        // The skipped assistant message does not count as a turn.
        assert_eq!(items[1].turn, 1);
        let input = json!([{"type": "brand_new_item"}, {"role": "user", "content": "go"}]);
        assert!(read_responses_input(&input, Mode::Strict).is_err());
        assert_eq!(
            kinds(&read_responses_input(&input, Mode::Lenient).unwrap()),
            ["user"]
        );
    }

    #[test]
    fn assistant_side_items_are_recognised() {
        assert!(is_assistant(&json!({"role": "assistant", "content": "x"})));
        assert!(is_assistant(
            &json!({"type": "function_call", "call_id": "c"})
        ));
        assert!(is_assistant(
            &json!({"type": "message", "role": "assistant"})
        ));
        assert!(!is_assistant(&json!({"type": "function_call_output"})));
        assert!(!is_assistant(&json!({"role": "user", "content": "x"})));
        assert!(!is_assistant(&json!({"role": "tool", "content": "x"})));
    }

    #[test]
    fn smolagents_memory_reads_its_calls_and_observations() {
        // A ToolCallingAgent's steps: the calls only in the `tool-call` message's repr.
        let step = |i: u32| {
            [
                json!({"role": "tool-call", "content": [{"type": "text", "text": format!("Calling tools:\n[{{'id': 'call_{i}', 'type': 'function', 'function': {{'name': 'web_search', 'arguments': {{'query': \"rust's borrow checker\"}}}}}}]")}]}),
                json!({"role": "tool-response", "content": [{"type": "text", "text": format!("Call id: call_{i}\nObservation:\nNo results found.")}]}),
            ]
        };
        let mut msgs = vec![json!({"role": "user", "content": "New task: find it"})];
        msgs.extend(step(1));
        msgs.extend(step(2));
        let items = read_messages(&msgs, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["user", "call", "result", "call", "result"]);
        match &items[3].kind {
            Kind::Call {
                id,
                tool,
                arguments: Args::Json(a),
            } => {
                assert_eq!((id.as_str(), tool.as_str()), ("call_2", "web_search"));
                assert_eq!(a, &json!({"query": "rust's borrow checker"}));
            }
            other => panic!("{other:?}"),
        }
        // A CodeAgent's step: the assistant's code action is the call, the repr repeats it.
        let msgs = vec![
            json!({"role": "assistant", "content": "Thought: look\nCode:\n```py\nprint(len(open('a').read()))\n```<end_code>"}),
            json!({"role": "tool-call", "content": "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'python_interpreter', 'arguments': \"print(len(open('a').read()))\"}}]"}),
            json!({"role": "tool-response", "content": "Call id: call_1\nObservation:\nExecution logs:\n42"}),
        ];
        let items = read_messages(&msgs, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["text", "call", "result"]);
        // A list that is no literal is an error in a recording, passed over live.
        let bad = vec![json!({"role": "tool-call", "content": "Calling tools:\n[{'id': "})];
        assert!(read_messages(&bad, Mode::Strict).is_err());
        assert!(read_messages(&bad, Mode::Lenient).unwrap().is_empty());
    }

    /// A tool use written in the text (Cline's XML, OpenHands' function tags, ReAct) was kept
    /// in the turn's text: a file's repeated lines in its parameters read as chanting.
    #[test]
    fn a_call_written_in_text_is_not_part_of_the_turns_prose() {
        let repeated = "assert parse('a') == 1\n".repeat(8);
        for (text, prose) in [
            (
                format!(
                    "I'll write the tests.\n\n<write_to_file>\n<path>t.py</path>\n<content>\n{repeated}</content>\n</write_to_file>"
                ),
                "I'll write the tests.\n\n",
            ),
            (
                format!(
                    "Writing them now.\n<function=str_replace_editor>\n<parameter=command>create</parameter>\n<parameter=file_text>\n{repeated}</parameter>\n</function>"
                ),
                "Writing them now.\n",
            ),
            (
                "Thought: look it up\nAction: search\nAction Input: borrow checker".to_owned(),
                "Thought: look it up\n",
            ),
        ] {
            let items = read_messages(
                &[json!({"role": "assistant", "content": text})],
                Mode::Strict,
            )
            .unwrap();
            assert_eq!(kinds(&items), ["text", "call"], "{text}");
            match &items[0].kind {
                Kind::Text {
                    text: t, narration, ..
                } => {
                    assert_eq!(t, prose);
                    assert!(narration);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// Agents that write their action as a JSON object get their observation back as the next
    /// message: Terminus as a user message labelled `New Terminal Output:`, AutoGPT in the
    /// system role (`Command … returned: …`) before its fixed prompt.
    #[test]
    fn json_actions_are_answered_by_the_next_observation() {
        let msgs = vec![
            json!({"role": "user", "content": "Fix the build."}),
            json!({"role": "assistant", "content": "{\"analysis\": \"a\", \"plan\": \"p\", \"commands\": [{\"keystrokes\": \"make\\n\", \"duration\": 5}], \"task_complete\": false}"}),
            json!({"role": "user", "content": "New Terminal Output:\n\nmake: *** [all] Error 1\n"}),
            json!({"role": "assistant", "content": "{\"analysis\": \"a\", \"plan\": \"wait\", \"commands\": [{\"keystrokes\": \"\", \"duration\": 30}]}"}),
            json!({"role": "user", "content": "New Terminal Output:\n\n"}),
        ];
        let items = read_messages(&msgs, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["user", "call", "result", "call", "result"]);
        let outputs = outputs(&items);
        assert_eq!(outputs, ["make: *** [all] Error 1\n", ""]);

        let msgs = vec![
            json!({"role": "system", "content": "You are NewsBot."}),
            json!({"role": "assistant", "content": "{\"thoughts\": {\"text\": \"search\"}, \"command\": {\"name\": \"google\", \"args\": {\"query\": \"ai news\"}}}"}),
            json!({"role": "system", "content": "Command google returned: [\"https://example.com/a\"]"}),
            json!({"role": "user", "content": "Determine exactly one command to use, and respond using the JSON schema specified previously:"}),
        ];
        let items = read_messages(&msgs, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["call", "result", "user"]);
        // A system message that is no answer leaves the call waiting for its observation.
        let msgs = vec![
            json!({"role": "assistant", "content": "{\"command\": {\"name\": \"google\", \"args\": {}}}"}),
            json!({"role": "system", "content": "Reminder: be brief."}),
            json!({"role": "user", "content": "Observation: nothing found"}),
        ];
        let items = read_messages(&msgs, Mode::Strict).unwrap();
        assert_eq!(kinds(&items), ["call", "result"]);
    }

    #[test]
    fn each_responses_call_item_is_read_as_a_call() {
        let read = |v: Value| {
            let obj = v.as_object().cloned().unwrap_or_default();
            responses_call(&obj).map(|c| {
                (
                    c.id.and_then(Value::as_str).map(str::to_owned),
                    c.name.to_owned(),
                    c.arguments.cloned(),
                )
            })
        };
        assert_eq!(
            read(
                json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "ls", "arguments": "{}"})
            ),
            Some((Some("c1".into()), "ls".into(), Some(json!("{}"))))
        );
        assert_eq!(
            read(
                json!({"type": "custom_tool_call", "id": "ct_1", "name": "patch", "input": "*** Begin"})
            ),
            Some((
                Some("ct_1".into()),
                "patch".into(),
                Some(json!("*** Begin"))
            ))
        );
        assert_eq!(
            read(json!({"type": "custom_tool_call", "call_id": "c", "name": "patch", "input": 3})),
            Some((Some("c".into()), "patch".into(), None))
        );
        assert_eq!(
            read(
                json!({"type": "local_shell_call", "call_id": "c", "action": {"command": ["ls"]}})
            ),
            Some((
                Some("c".into()),
                "local_shell".into(),
                Some(json!({"command": ["ls"]}))
            ))
        );
        assert_eq!(read(json!({"type": "reasoning", "summary": []})), None);
        assert_eq!(read(json!({"role": "assistant", "content": "x"})), None);
    }
}
