//! The wire formats the proxy speaks, each plain and streamed, with the same enforcement:
//!
//! | format | route | conversation | calls | results |
//! |---|---|---|---|---|
//! | [`Wire::Chat`]: OpenAI chat completions | `POST /v1/chat/completions` | `messages` | `tool_calls` | `role: tool` messages |
//! | [`Wire::Messages`]: Anthropic Messages | `POST /v1/messages` | `messages` (+ `system`) | `tool_use` blocks | `tool_result` blocks |
//! | [`Wire::Responses`]: OpenAI Responses | `POST /v1/responses` | `input` items (+ `instructions`, `previous_response_id`) | `function_call` items | `function_call_output` items |
//! | [`Wire::Gemini`]: Google Gemini | `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` | `contents` (+ `systemInstruction`) | `functionCall` parts | `functionResponse` parts |
//!
//! What every format shares lives here: reading the conversation into events (through
//! [`loopguard_transcript::messages`], the reader `loopctl simulate` uses), finding the
//! session's hints, stripping in-chat commands, placing nudges. What differs — where a result
//! lives, how a note is added to it, how a response and its stream are shaped — is in one module
//! per format ([`chat`], [`messages`], [`responses`], [`gemini`]), behind the same functions.

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;

use loopguard_transcript::Item;
use loopguard_transcript::messages::Mode;
use serde_json::{Value, json};

use crate::body::{Body, Messages, Peek};
use crate::commands::{self, Command};
use crate::judge::{CallIn, Intervention, Judge};
use crate::sse;

/// Prefix of every text the proxy writes into a conversation.
pub const MARK: &str = "[loopguard]";

/// A wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// OpenAI chat completions.
    Chat,
    /// Anthropic Messages.
    Messages,
    /// OpenAI Responses.
    Responses,
    /// Google Gemini `generateContent`.
    Gemini,
}

/// How the proxy sees one message (or Responses item) of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A user-role message without tool results (a person's, unless it follows results).
    Person,
    /// Tool results (with any text beside them, which is the host's).
    Results,
    /// Written by the model.
    Assistant,
    /// System, developer and anything else.
    Other,
}

impl Wire {
    /// The format's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Chat => "chat_completions",
            Wire::Messages => "messages",
            Wire::Responses => "responses",
            Wire::Gemini => "gemini",
        }
    }

    /// The upstream path under the base URL (Gemini's is the request's own path, which names
    /// the model and the method).
    pub fn upstream_path(self) -> &'static [&'static str] {
        match self {
            Wire::Chat => &["chat", "completions"],
            Wire::Messages => &["messages"],
            Wire::Responses => &["responses"],
            Wire::Gemini => &[],
        }
    }

    /// The key of the conversation in a request body.
    pub fn list_key(self) -> &'static str {
        match self {
            Wire::Chat | Wire::Messages => "messages",
            Wire::Responses => "input",
            Wire::Gemini => "contents",
        }
    }

    /// A request body of this format, read lazily (see [`crate::body`]).
    pub fn body(self, bytes: &[u8]) -> Result<Body<'_>, crate::body::NotAnObject> {
        Body::parse(bytes, self.list_key())
    }

    /// The conversation read into events, leniently (each event's `line` is its message's
    /// 1-based position).
    pub fn read(self, list: &[Value]) -> Vec<Item> {
        let read = match self {
            Wire::Chat | Wire::Messages => {
                loopguard_transcript::messages::read_messages(list, Mode::Lenient)
            }
            Wire::Responses => {
                let positioned: Vec<(usize, &Value)> =
                    list.iter().enumerate().map(|(i, v)| (i + 1, v)).collect();
                loopguard_transcript::messages::read_responses_items(&positioned, Mode::Lenient)
            }
            Wire::Gemini => return gemini::read(list, 0),
        };
        // Lenient reading passes over what it cannot read instead of failing.
        read.unwrap_or_default()
    }

    /// The events of the conversation from message `tail` on (see [`Wire::read`]); Gemini's
    /// are read with the model answer before them, whose calls their responses answer.
    pub fn read_tail(self, msgs: &mut Messages<'_>, tail: usize) -> Vec<Item> {
        match self {
            Wire::Gemini => gemini::read_tail(msgs, tail),
            _ => self.read(&msgs.values(tail)),
        }
    }

    /// The model a request's body names (Gemini's is in the path).
    pub fn model(self, body: &mut Body<'_>) -> Option<String> {
        match self {
            Wire::Gemini => None,
            _ => body.text("model"),
        }
    }

    /// Whether the request's body asks for a stream (Gemini's method says so).
    pub fn wants_stream(self, body: &mut Body<'_>) -> bool {
        self != Wire::Gemini && body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// The key of a message's content: Gemini's `parts`, every other format's `content`.
    fn content_key(self) -> &'static str {
        match self {
            Wire::Gemini => "parts",
            _ => "content",
        }
    }

    /// The client's own name for the conversation or its end user, when the request carries
    /// one: chat's `user`, Anthropic's `metadata.user_id`, a Responses `conversation` or
    /// `user`. Used for the session when there is no `X-Session-Id` header.
    pub fn session_hint(self, body: &mut Body<'_>) -> Option<(&'static str, String)> {
        let text = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        match self {
            Wire::Chat => text(body.get("user")).map(|u| ("user", u)),
            Wire::Messages => {
                text(body.get("metadata").and_then(|m| m.get("user_id"))).map(|u| ("user", u))
            }
            Wire::Responses => {
                let conversation = body.get("conversation");
                text(conversation)
                    .or_else(|| text(conversation.and_then(|c| c.get("id"))))
                    .map(|c| ("conv", c))
                    .or_else(|| text(body.get("user")).map(|u| ("user", u)))
            }
            Wire::Gemini => None,
        }
    }

    /// The stored response a Responses request continues (`previous_response_id`).
    pub fn previous_response(self, body: &mut Body<'_>) -> Option<String> {
        match self {
            Wire::Responses => body.text("previous_response_id").filter(|s| !s.is_empty()),
            _ => None,
        }
    }

    /// What opens a conversation and stays as it grows: the system prompt and the first
    /// person's message, as text for a hash that names the session when nothing else does.
    pub fn opening(self, body: &mut Body<'_>) -> String {
        let mut text = String::new();
        let mut add = |role: &str, v: Option<&Value>| {
            // `serde_json` maps keep their keys sorted, so equal content prints equally.
            text.push_str(role);
            text.push('\u{1f}');
            text.push_str(&v.map(Value::to_string).unwrap_or_default());
            text.push('\u{1e}');
        };
        match self {
            Wire::Messages => add("system", body.get("system")),
            Wire::Responses => add("instructions", body.get("instructions")),
            Wire::Gemini => {
                let system = body.get("systemInstruction").cloned();
                let system = system.or_else(|| body.get("system_instruction").cloned());
                add("systemInstruction", system.as_ref());
            }
            Wire::Chat => {}
        }
        let key = self.content_key();
        if let Some(msgs) = body.messages.as_mut() {
            for i in 0..msgs.len() {
                let Some(m) = msgs.get(i) else { break };
                let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                add(role, m.get(key));
                if role != "system" && role != "developer" {
                    break;
                }
            }
        }
        text
    }

    /// How the proxy sees a message of the conversation, from its peek.
    pub fn classify(self, p: &Peek) -> Seen {
        let role = p.role.as_deref().unwrap_or_default();
        match self {
            Wire::Chat => match role {
                "user" => Seen::Person,
                "tool" | "function" => Seen::Results,
                "assistant" => Seen::Assistant,
                _ => Seen::Other,
            },
            Wire::Messages => match role {
                "user" if p.has_results => Seen::Results,
                "user" => Seen::Person,
                "assistant" => Seen::Assistant,
                _ => Seen::Other,
            },
            // Results are told apart in [`Wire::seen`], which reads the parts.
            Wire::Gemini => match role {
                "model" => Seen::Assistant,
                "" | "user" => Seen::Person,
                _ => Seen::Other,
            },
            Wire::Responses => match p.kind.as_deref() {
                None | Some("message") => match role {
                    "assistant" => Seen::Assistant,
                    "user" => Seen::Person,
                    _ => Seen::Other,
                },
                Some(t) if loopguard_transcript::messages::is_output_item(t) => Seen::Results,
                Some(t) if loopguard_transcript::messages::is_model_item(t) => Seen::Assistant,
                Some(_) => Seen::Other,
            },
        }
    }

    /// How the proxy sees message `i`.
    pub fn seen(self, msgs: &mut Messages<'_>, i: usize) -> Seen {
        if self == Wire::Gemini {
            return gemini::seen(msgs, i);
        }
        self.classify(msgs.peek(i))
    }

    /// Whether message `i` is an assistant message that makes no structured call (no chat
    /// `tool_calls` or `function_call`, no `tool_use` block, not a Responses call item), and so
    /// may have written one in its text. Gemini's contents are not read this way.
    pub fn may_write_call_in_text(self, msgs: &mut Messages<'_>, i: usize) -> bool {
        if self == Wire::Gemini || self.seen(msgs, i) != Seen::Assistant {
            return false;
        }
        let p = msgs.peek(i);
        if p.has_tool_calls || p.has_calls || p.kind.as_deref().is_some_and(|k| k != "message") {
            return false;
        }
        msgs.get(i)
            .is_some_and(|m| m.get("function_call").is_none_or(Value::is_null))
    }

    /// The call ids a results message answers.
    pub fn result_ids(self, m: &Value) -> Vec<&str> {
        match self {
            Wire::Chat => m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .into_iter()
                .collect(),
            Wire::Messages => messages::result_ids(m),
            Wire::Responses => m
                .get("call_id")
                .and_then(Value::as_str)
                .into_iter()
                .collect(),
            // Their own ids only: the others follow from the calls before them (see
            // [`gemini::with_ids`]).
            Wire::Gemini => m
                .get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    p.get("functionResponse")
                        .or_else(|| p.get("function_response"))
                })
                .filter_map(|r| r.get("id").and_then(Value::as_str))
                .collect(),
        }
    }

    /// The tool name of the call `id`, from the assistant messages of a conversation.
    pub fn call_name(self, msgs: &mut Messages<'_>, id: &str) -> Option<String> {
        if self == Wire::Gemini {
            return gemini::call_name(msgs, id);
        }
        let name = |v: &Value| v.get("name").and_then(Value::as_str).map(str::to_owned);
        for i in (0..msgs.len()).rev() {
            if self.seen(msgs, i) != Seen::Assistant || msgs.raw(i).is_some_and(|r| !r.contains(id))
            {
                continue;
            }
            let Some(m) = msgs.get(i) else { continue };
            let found = match self {
                Wire::Chat => m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .and_then(|c| {
                        c.iter()
                            .find(|c| c.get("id").and_then(Value::as_str) == Some(id))
                    })
                    .and_then(|c| c.get("function"))
                    .and_then(name),
                Wire::Messages => m
                    .get("content")
                    .and_then(Value::as_array)
                    .and_then(|b| {
                        b.iter()
                            .find(|b| b.get("id").and_then(Value::as_str) == Some(id))
                    })
                    .and_then(name),
                Wire::Responses => (m.get("call_id").and_then(Value::as_str) == Some(id))
                    .then(|| name(m))
                    .flatten(),
                Wire::Gemini => None,
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Appends `note` to the result answering `id` in message `m`.
    fn append_to_result(self, m: &mut Value, id: &str, note: &str) {
        match self {
            Wire::Chat => append_to(m, "content", note, "text"),
            Wire::Messages => messages::append_to_result(m, id, note),
            Wire::Responses => append_to(m, "output", note, "input_text"),
            // Placed by [`gemini::apply_nudges`].
            Wire::Gemini => {}
        }
    }

    /// A note the proxy adds to a conversation on its own (a system message; for Anthropic,
    /// which has no system role inside `messages`, a user message).
    fn note_message(self, note: &str) -> Value {
        match self {
            Wire::Chat | Wire::Responses => json!({"role": "system", "content": note}),
            Wire::Messages => json!({"role": "user", "content": [{"type": "text", "text": note}]}),
            Wire::Gemini => gemini::note_content(note),
        }
    }

    /// The text part type of user content in this format.
    fn text_part(self) -> &'static str {
        match self {
            Wire::Chat | Wire::Messages | Wire::Gemini => "text",
            Wire::Responses => "input_text",
        }
    }

    /// Whether message `i` is the proxy's own reply (an assistant message starting with
    /// [`MARK`] and calling nothing).
    fn is_proxy_reply(self, msgs: &mut Messages<'_>, i: usize) -> bool {
        let p = msgs.peek(i);
        if self.classify(p) != Seen::Assistant || p.has_tool_calls || p.has_calls {
            return false;
        }
        if self == Wire::Responses && p.kind.as_deref().is_some_and(|t| t != "message") {
            return false;
        }
        let key = self.content_key();
        msgs.get(i).is_some_and(|m| {
            text_of(m.get(key)).starts_with(MARK) && !(self == Wire::Gemini && gemini::has_calls(m))
        })
    }

    /// Judges a whole response and rewrites it for the client: see each format's `rewrite`.
    pub fn rewrite(self, body: &mut Value, judge: &mut dyn Judge) -> Rewritten {
        match self {
            Wire::Chat => chat::rewrite(body, judge),
            Wire::Messages => messages::rewrite(body, judge),
            Wire::Responses => responses::rewrite(body, judge),
            Wire::Gemini => gemini::rewrite(body, judge),
        }
    }

    /// A rewriter for a streamed response.
    pub fn stream<J: Judge + 'static>(self, judge: J) -> Box<dyn Rewriter<J>> {
        match self {
            Wire::Chat => Box::new(chat::Stream::new(judge)),
            Wire::Messages => Box::new(messages::Stream::new(judge)),
            Wire::Responses => Box::new(responses::Stream::new(judge)),
            Wire::Gemini => Box::new(gemini::Stream::new(judge)),
        }
    }

    /// The proxy's own answer (to in-chat commands) in this format: the body and its content
    /// type, a whole response or a stream of events as the client asked.
    pub fn reply(self, text: &str, model: &str, id: u64, stream: bool) -> (String, &'static str) {
        let body = match self {
            Wire::Chat => chat::reply(text, model, id, stream),
            Wire::Messages => messages::reply(text, model, id, stream),
            Wire::Responses => responses::reply(text, model, id, stream),
            Wire::Gemini => gemini::reply(text, model, id, stream),
        };
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        (body, content_type)
    }

    /// The request to ask the upstream again with, after its answer `answer` (a whole
    /// response) was a lone repeated call that the proxy withholds: the answer and a failed
    /// result carrying `guidance` for `call` appended to the conversation. `None` when the
    /// answer cannot be read.
    pub fn retry(
        self,
        request: &Value,
        answer: &Value,
        call: &CallIn,
        guidance: &str,
    ) -> Option<Value> {
        match self {
            Wire::Chat => chat::retry(request, answer, call, guidance),
            Wire::Messages => messages::retry(request, answer, call, guidance),
            Wire::Responses => responses::retry(request, answer, call, guidance),
            Wire::Gemini => gemini::retry(request, answer, call, guidance),
        }
    }
}

/// What rewriting a whole response did.
#[derive(Debug)]
pub enum Rewritten {
    /// The body was judged (and changed where the judge said); these are the interventions.
    Judged(Vec<Intervention>),
    /// The session is stopped: answer with this error.
    Stop(crate::error::ApiError),
    /// The body is not a response of this format.
    Malformed(String),
}

/// Rewrites a streamed response: upstream bytes in, events for the client out.
pub trait Rewriter<J>: Send {
    /// Feeds bytes from the upstream; returns the events to send to the client.
    fn push(&mut self, bytes: &[u8]) -> Vec<String>;
    /// The upstream stream ended: every turn not yet judged is judged.
    fn finish(&mut self) -> Vec<String>;
    /// The state every format's rewriter keeps.
    fn state(&self) -> &StreamState;
    /// The judge.
    fn judge(&mut self) -> &mut J;
    /// How many calls were assembled but never judged nor released (a stream cut short).
    fn abandon(&mut self) -> usize;
    /// The whole answer the stream assembled so far, as the format's whole response (for
    /// asking the upstream again after it).
    fn answer(&self) -> Option<Value>;
    /// The judge, taken back.
    fn into_judge(self: Box<Self>) -> J;
    /// The stream is the upstream's second answer, continuing the first (withheld) one: it is
    /// shown to the client as continuing `previous` instead, the response the client named
    /// (Responses; other formats have no such field).
    fn continues(&mut self, previous: Option<&str>) {
        let _ = previous;
    }
}

/// What a format's stream rewriter does with the events of the stream; [`feed`] and [`end`]
/// run them through it (the part every format shares).
pub(crate) trait Events {
    /// The format.
    const WIRE: Wire;
    /// The splitter of the stream's bytes into events.
    fn splitter(&mut self) -> &mut sse::Splitter;
    /// The stream's state.
    fn stream_state(&mut self) -> &mut StreamState;
    /// Handles one event, adding what the client gets to `out`.
    fn on_event(&mut self, ev: sse::Event, out: &mut Vec<String>);
    /// The stream ended: judges and releases what is still held.
    fn at_end(&mut self, out: &mut Vec<String>);
}

/// What each choice, call, block or item a stream rewriter holds costs against its buffer limit
/// besides its text, so that a stream of many empty ones is bounded like one of long ones.
pub(crate) const ENTRY_COST: usize = 256;

/// Feeds upstream bytes through a rewriter; returns the events for the client.
pub(crate) fn feed<E: Events>(e: &mut E, bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    if e.stream_state().closed {
        return out;
    }
    let mut events = Vec::new();
    let too_large = e.splitter().push(bytes, &mut events).is_err();
    for ev in events {
        if e.stream_state().closed {
            break;
        }
        e.on_event(ev, &mut out);
    }
    if too_large && !e.stream_state().closed {
        e.stream_state()
            .fail(E::WIRE, &mut out, "an SSE event larger than 16 MiB");
    }
    out
}

/// Ends a rewriter's stream: an unfinished event is handled, then what is still held.
pub(crate) fn end<E: Events>(e: &mut E) -> Vec<String> {
    let mut out = Vec::new();
    if e.stream_state().closed {
        return out;
    }
    let mut events = Vec::new();
    e.splitter().finish(&mut events);
    for ev in events {
        if e.stream_state().closed {
            break;
        }
        e.on_event(ev, &mut out);
    }
    if !e.stream_state().closed {
        e.at_end(&mut out);
    }
    out
}

/// What a stream rewriter knows about the stream so far.
#[derive(Debug, Default)]
pub struct StreamState {
    /// The error a terminate verdict ended the stream with (also sent as its last event).
    pub terminated: Option<crate::error::ApiError>,
    /// Something the client must see has been emitted: text, a released call, a finish.
    pub committed: bool,
    /// The stream ended (terminated, or failed): nothing more is sent.
    pub closed: bool,
    /// The upstream sent an error event of its own.
    pub upstream_error: bool,
    /// The upstream sent something that is not a stream of this format.
    pub malformed: bool,
    /// Every intervention of the stream.
    pub interventions: Vec<Intervention>,
}

impl StreamState {
    /// Closes the stream with an upstream-malformed error event.
    pub(crate) fn fail(&mut self, wire: Wire, out: &mut Vec<String>, what: &str) {
        self.malformed = true;
        self.closed = true;
        out.push(
            crate::error::ApiError::upstream(
                axum::http::StatusCode::BAD_GATEWAY,
                "upstream_malformed",
                format!("the upstream stream is malformed: {what}"),
            )
            .sse_event(wire),
        );
    }

    /// Closes the stream with the stop `e`.
    pub(crate) fn stop(&mut self, wire: Wire, out: &mut Vec<String>, e: crate::error::ApiError) {
        self.closed = true;
        out.push(e.sse_event(wire));
        self.terminated = Some(e);
    }
}

// --- content ---------------------------------------------------------------------------------

/// The text of message content: a string, or the text parts of an array, joined by newlines.
pub fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                _ => p.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Appends a note to content (a string, an array of parts, or null); a part added to an array
/// has type `part`.
pub fn append_text(content: &mut Value, note: &str, part: &str) {
    match content {
        Value::String(s) if s.is_empty() => note.clone_into(s),
        Value::String(s) => {
            s.push_str("\n\n");
            s.push_str(note);
        }
        Value::Array(parts) => parts.push(json!({"type": part, "text": note})),
        other => *other = Value::String(note.to_owned()),
    }
}

/// Appends a note to `m[key]`, creating it when absent.
/// Applies notes about calls written in assistant text: `(turn, note, replaces)` goes to the
/// first person's message after the `turn`-th assistant message (counted from 1), the
/// observation a framework sends back for such a call; added to it, or instead of it. Returns
/// whether anything changed. Gemini's contents are left as they are.
pub fn apply_text_notes(
    wire: Wire,
    msgs: &mut Messages<'_>,
    notes: &[(u64, String, bool)],
) -> bool {
    if notes.is_empty() || wire == Wire::Gemini {
        return false;
    }
    let mut changed = false;
    let mut turn = 0u64;
    let mut i = 0;
    while i < msgs.len() {
        if wire.seen(msgs, i) != Seen::Assistant {
            i += 1;
            continue;
        }
        turn += 1;
        i += 1;
        let mine: Vec<&(u64, String, bool)> = notes.iter().filter(|n| n.0 == turn).collect();
        if mine.is_empty() {
            continue;
        }
        // The observation: the next person's message, before any other assistant message.
        let mut j = i;
        while j < msgs.len() && !matches!(wire.seen(msgs, j), Seen::Person | Seen::Assistant) {
            j += 1;
        }
        if j >= msgs.len() || wire.seen(msgs, j) != Seen::Person {
            continue;
        }
        let Some(m) = msgs.get_mut(j) else { continue };
        for (_, note, replaces) in mine {
            if *replaces && let Some(obj) = m.as_object_mut() {
                obj.insert("content".to_owned(), Value::String(note.clone()));
            } else {
                append_to(m, "content", note, wire.text_part());
            }
        }
        changed = true;
    }
    changed
}

fn append_to(m: &mut Value, key: &str, note: &str, part: &str) {
    let Some(obj) = m.as_object_mut() else {
        return;
    };
    match obj.get_mut(key) {
        Some(c) => append_text(c, note, part),
        None => {
            obj.insert(key.to_owned(), Value::String(note.to_owned()));
        }
    }
}

// --- in-chat commands ------------------------------------------------------------------------

/// What [`strip_commands`] found.
#[derive(Debug, Default)]
pub struct Stripped {
    /// Valid commands in tail messages, in order.
    pub commands: Vec<Command>,
    /// Problems with tail commands.
    pub errors: Vec<String>,
    /// The request's last message was a user message holding only commands: it asks the
    /// proxy, not the model, and gets the proxy's reply.
    pub reply_needed: bool,
    /// Something was taken out of the conversation.
    pub changed: bool,
}

/// Strips commands from a user message's content; returns the scan of each text found and
/// whether anything but commands is left.
fn strip_content(content: &mut Value, scans: &mut Vec<commands::Scan>) -> bool {
    match content {
        Value::String(s) => {
            let scan = commands::scan(s);
            let left = !scan.text.is_empty() || !scan.found;
            if scan.found {
                s.clone_from(&scan.text);
                scans.push(scan);
            }
            left
        }
        Value::Array(parts) => {
            parts.retain_mut(|p| {
                let Some(Value::String(t)) = p.get_mut("text") else {
                    return true; // images, audio, files: kept as they are
                };
                let scan = commands::scan(t);
                if !scan.found {
                    return true;
                }
                t.clone_from(&scan.text);
                let keep = !scan.text.is_empty();
                scans.push(scan);
                keep
            });
            !parts.is_empty()
        }
        _ => true,
    }
}

/// The position where the tail starts: the messages after the last one the model wrote
/// (what is new since the proxy last answered).
pub fn tail_start(wire: Wire, msgs: &mut Messages<'_>) -> usize {
    (0..msgs.len())
        .rev()
        .find(|&i| wire.seen(msgs, i) == Seen::Assistant)
        .map_or(0, |i| i + 1)
}

/// Strips in-chat commands from every person's message and collects the ones in the tail.
///
/// A message left empty is dropped, and so is the proxy's reply to it (the assistant message
/// right after it, if it starts with [`MARK`] and calls nothing): the model sees neither the
/// commands nor the proxy's answers to them.
///
/// Commands are read only from a person's own text: a user message right after tool results
/// (or tool results with text beside them) is the host's — a framework's observation, pasted
/// tool output, a "continue" prompt — and is left as it is. Without `honour` (commands not
/// allowed for this caller) nothing is read or stripped: the text goes to the model as
/// written. Only messages holding `!/` are parsed.
pub fn strip_commands(wire: Wire, msgs: &mut Messages<'_>, honour: bool) -> Stripped {
    let mut out = Stripped::default();
    if !honour {
        return out;
    }
    let tail = tail_start(wire, msgs);
    let n = msgs.len();
    let mut drop = Vec::new();
    let mut drop_reply = false;
    let mut after_results = false;
    for i in 0..n {
        let seen = wire.seen(msgs, i);
        let hosts = after_results;
        after_results = seen == Seen::Results;
        if drop_reply {
            drop_reply = false;
            if wire.is_proxy_reply(msgs, i) {
                drop.push(i);
                continue;
            }
        }
        if seen != Seen::Person || hosts || msgs.raw(i).is_some_and(|r| !r.contains("!/")) {
            continue;
        }
        let mut scans = Vec::new();
        let key = wire.content_key();
        let has = msgs
            .get(i)
            .and_then(|m| m.get(key))
            .is_some_and(|c| text_of(Some(c)).contains("!/"));
        if !has {
            continue;
        }
        let Some(content) = msgs.get_mut(i).and_then(|m| m.get_mut(key)) else {
            continue;
        };
        let left = strip_content(content, &mut scans);
        out.changed |= !scans.is_empty();
        if i >= tail {
            for s in scans {
                out.commands.extend(s.commands);
                out.errors.extend(s.errors);
            }
        }
        if !left {
            drop.push(i);
            drop_reply = true;
            if i + 1 == n {
                out.reply_needed = true;
            }
        }
    }
    for &i in drop.iter().rev() {
        msgs.remove(i);
        out.changed = true;
    }
    out
}

// --- nudges ----------------------------------------------------------------------------------

/// Where nudges go in the request to the model: the policy's `escalation.nudge`.
///
/// `Context` appends a nudge to the content of the tool result answering the call it is about
/// (the model reads it with the output); a nudge about no call (text loops) is appended to the
/// request's last message when that is a person's or a result, else it is a note of its own.
/// `System` adds a system message after the tool results it is about (Anthropic, which has no
/// system role inside `messages`: a text block after them in their message); some chat
/// templates refuse system messages after the first one.
pub use loopguard_rules::Nudge as NudgePlacement;

/// Adds nudges to a conversation. `anchored` are (call id, text): the result answering that
/// call gets the note, in this request and every later one, so the conversation the model sees
/// stays the same from turn to turn. `loose` notes about no call are added once. Returns
/// whether anything was added. Only results whose text names an anchored call are parsed.
pub fn apply_nudges(
    wire: Wire,
    msgs: &mut Messages<'_>,
    anchored: &[(String, String)],
    loose: &[String],
    placement: NudgePlacement,
) -> bool {
    if wire == Wire::Gemini {
        return gemini::apply_nudges(msgs, anchored, loose, placement);
    }
    let mut changed = !loose.is_empty();
    // (position, notes) of every result message with anchored notes.
    let mut found: Vec<(usize, Vec<(String, String)>)> = Vec::new();
    if !anchored.is_empty() {
        for i in 0..msgs.len() {
            if wire.seen(msgs, i) != Seen::Results {
                continue;
            }
            if let Some(raw) = msgs.raw(i)
                && !anchored.iter().any(|(id, _)| raw.contains(id.as_str()))
            {
                continue;
            }
            let Some(m) = msgs.get(i) else { continue };
            let ids = wire.result_ids(m);
            let notes: Vec<(String, String)> = anchored
                .iter()
                .filter(|(a, _)| ids.contains(&a.as_str()))
                .cloned()
                .collect();
            if !notes.is_empty() {
                found.push((i, notes));
            }
        }
    }
    changed |= !found.is_empty();
    match placement {
        NudgePlacement::Context => {
            for (i, notes) in &found {
                if let Some(m) = msgs.get_mut(*i) {
                    for (id, note) in notes {
                        wire.append_to_result(m, id, note);
                    }
                }
            }
        }
        NudgePlacement::System if wire == Wire::Messages => {
            for (i, notes) in &found {
                let text: Vec<&str> = notes.iter().map(|(_, n)| n.as_str()).collect();
                if let Some(m) = msgs.get_mut(*i) {
                    append_to(m, "content", &text.join("\n"), "text");
                }
            }
        }
        NudgePlacement::System => {
            // A note after each run of results that holds anchored ones, from the last run
            // back (so earlier positions stay valid).
            let mut runs: Vec<(usize, Vec<String>)> = Vec::new();
            for (i, notes) in found {
                let mut end = i + 1;
                while end < msgs.len() && wire.seen(msgs, end) == Seen::Results {
                    end += 1;
                }
                let texts = notes.into_iter().map(|(_, n)| n);
                match runs.last_mut() {
                    Some((e, t)) if *e == end => t.extend(texts),
                    _ => runs.push((end, texts.collect())),
                }
            }
            for (end, texts) in runs.into_iter().rev() {
                msgs.insert(end, wire.note_message(&texts.join("\n")));
            }
        }
    }
    if loose.is_empty() {
        return changed;
    }
    let note = loose.join("\n");
    let last = msgs.len().checked_sub(1);
    let seen = last.map(|i| wire.seen(msgs, i));
    match (last, seen) {
        (Some(i), Some(Seen::Person))
            if placement == NudgePlacement::Context || wire == Wire::Messages =>
        {
            if let Some(m) = msgs.get_mut(i) {
                append_to(m, "content", &note, wire.text_part());
            }
        }
        (Some(i), Some(Seen::Results)) if wire == Wire::Messages => {
            if let Some(m) = msgs.get_mut(i) {
                append_to(m, "content", &note, "text");
            }
        }
        (Some(i), Some(Seen::Results)) if placement == NudgePlacement::Context => {
            if let Some(m) = msgs.get_mut(i) {
                let id = wire.result_ids(m).first().map(|s| (*s).to_owned());
                if let Some(id) = id {
                    wire.append_to_result(m, &id, &note);
                }
            }
        }
        _ => msgs.push(wire.note_message(&note)),
    }
    changed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn msgs(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    /// The messages as the client's JSON text, read lazily as a request's are.
    fn lazy(v: &[Value]) -> String {
        serde_json::to_string(&json!({ "messages": v })).unwrap()
    }

    fn strip(wire: Wire, m: &mut Vec<Value>, honour: bool) -> Stripped {
        let text = lazy(m);
        let mut body = Body::parse(text.as_bytes(), "messages").unwrap();
        let msgs = body.messages.as_mut().unwrap();
        let out = strip_commands(wire, msgs, honour);
        *m = msgs.values(0);
        out
    }

    fn nudge(
        wire: Wire,
        m: &mut Vec<Value>,
        anchored: &[(String, String)],
        loose: &[String],
        placement: NudgePlacement,
    ) -> bool {
        let text = lazy(m);
        let mut body = Body::parse(text.as_bytes(), "messages").unwrap();
        let msgs = body.messages.as_mut().unwrap();
        let changed = apply_nudges(wire, msgs, anchored, loose, placement);
        assert_eq!(changed, msgs.changed());
        *m = msgs.values(0);
        changed
    }

    #[test]
    fn only_tail_commands_count_and_all_are_stripped() {
        let mut m = msgs(json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "!/set(tool-loop-ttl=5) fix it"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "!/set(tool-loop-max-repeats=4)"}
        ]));
        let s = strip(Wire::Chat, &mut m, true);
        assert!(s.reply_needed);
        assert_eq!(s.commands.len(), 1);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["content"], "fix it");
    }

    #[test]
    fn pure_commands_and_their_replies_leave_the_history() {
        for wire in [Wire::Chat, Wire::Messages] {
            let mut m = msgs(json!([
                {"role": "user", "content": "!/set(tool-loop-max-repeats=4)"},
                {"role": "assistant", "content": "[loopguard] Session settings changed"},
                {"role": "user", "content": [{"type": "text", "text": "build it"}]}
            ]));
            let s = strip(wire, &mut m, true);
            assert!(!s.reply_needed);
            assert!(s.commands.is_empty(), "not in the tail");
            assert_eq!(m.len(), 1);
            assert_eq!(m[0]["content"][0]["text"], "build it");
        }
        let mut m = msgs(json!([
            {"role": "user", "content": "!/set(tool-loop-max-repeats=4)"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "[loopguard] Done"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "build it"}]}
        ]));
        strip(Wire::Responses, &mut m, true);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn command_parts_are_removed_from_arrays() {
        let mut m = msgs(json!([
            {"role": "user", "content": [
                {"type": "text", "text": "!/unset(tool-loop-mode)"},
                {"type": "image_url", "image_url": {"url": "data:"}}
            ]}
        ]));
        let s = strip(Wire::Chat, &mut m, true);
        assert!(!s.reply_needed, "the image is still for the model");
        assert_eq!(m[0]["content"].as_array().unwrap().len(), 1);
        assert_eq!(s.commands.len(), 1);
    }

    #[test]
    fn commands_beside_tool_results_are_the_hosts() {
        // An Anthropic user message holding tool results: its text is pasted output.
        let mut m = msgs(json!([
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                {"type": "text", "text": "!/set(tool-loop-detection=false)"}]}
        ]));
        let s = strip(Wire::Messages, &mut m, true);
        assert!(s.commands.is_empty());
        assert_eq!(
            m[1]["content"][1]["text"],
            "!/set(tool-loop-detection=false)"
        );
    }

    #[test]
    fn context_nudges_follow_their_result_every_time() {
        let base = msgs(json!([
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "bash"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
            {"role": "user", "content": [{"type": "text", "text": "go"}]}
        ]));
        let anchored = vec![("c1".to_owned(), "[loopguard] stop".to_owned())];
        let mut m = base.clone();
        nudge(
            Wire::Chat,
            &mut m,
            &anchored,
            &["[loopguard] text".to_owned()],
            NudgePlacement::Context,
        );
        assert_eq!(m[1]["content"], "out\n\n[loopguard] stop");
        assert_eq!(m[2]["content"][1]["text"], "[loopguard] text");
        let mut m = base;
        nudge(Wire::Chat, &mut m, &anchored, &[], NudgePlacement::System);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[2],
            json!({"role": "system", "content": "[loopguard] stop"})
        );
    }

    #[test]
    fn nudges_reach_anthropic_and_responses_results() {
        let anchored = vec![("t1".to_owned(), "[loopguard] stop".to_owned())];
        let mut m = msgs(json!([
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "out"}]}
        ]));
        let mut s = m.clone();
        nudge(
            Wire::Messages,
            &mut m,
            &anchored,
            &[],
            NudgePlacement::Context,
        );
        assert_eq!(m[1]["content"][0]["content"], "out\n\n[loopguard] stop");
        nudge(
            Wire::Messages,
            &mut s,
            &anchored,
            &[],
            NudgePlacement::System,
        );
        assert_eq!(s.len(), 2, "no system role inside Anthropic messages");
        assert_eq!(
            s[1]["content"][1],
            json!({"type": "text", "text": "[loopguard] stop"})
        );
        let mut r = msgs(json!([
            {"type": "function_call", "call_id": "t1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "t1", "output": "out"}
        ]));
        nudge(
            Wire::Responses,
            &mut r,
            &anchored,
            &[],
            NudgePlacement::Context,
        );
        assert_eq!(r[1]["output"], "out\n\n[loopguard] stop");
    }

    #[test]
    fn loose_nudges_after_an_assistant_message_are_notes_of_their_own() {
        let mut m = msgs(json!([{"role": "assistant", "content": "hi"}]));
        nudge(
            Wire::Chat,
            &mut m,
            &[],
            &["n".to_owned()],
            NudgePlacement::Context,
        );
        assert_eq!(m[1]["role"], "system");
        let mut m = msgs(json!([{"role": "assistant", "content": "hi"}]));
        nudge(
            Wire::Messages,
            &mut m,
            &[],
            &["n".to_owned()],
            NudgePlacement::System,
        );
        assert_eq!(m[1]["role"], "user");
    }

    #[test]
    fn append_text_handles_every_shape() {
        let mut v = Value::Null;
        append_text(&mut v, "n", "text");
        assert_eq!(v, "n");
        let mut v = json!("");
        append_text(&mut v, "n", "text");
        assert_eq!(v, "n");
        let mut v = json!([]);
        append_text(&mut v, "n", "input_text");
        assert_eq!(v, json!([{"type": "input_text", "text": "n"}]));
    }

    #[test]
    fn sessions_are_hinted_and_opened_per_format() {
        let body = |wire: Wire, v: Value| Body::from_value(&v, wire.list_key()).unwrap();
        let mut chat = body(
            Wire::Chat,
            json!({"user": "u1", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]}),
        );
        assert_eq!(
            Wire::Chat.session_hint(&mut chat),
            Some(("user", "u1".to_owned()))
        );
        let mut anthropic = body(
            Wire::Messages,
            json!({"metadata": {"user_id": "u2"}, "system": "s", "messages": [{"role": "user", "content": "go"}]}),
        );
        assert_eq!(
            Wire::Messages.session_hint(&mut anthropic),
            Some(("user", "u2".to_owned()))
        );
        assert!(Wire::Messages.opening(&mut anthropic).contains("\"s\""));
        let mut responses = body(
            Wire::Responses,
            json!({"conversation": {"id": "conv_1"}, "input": "go"}),
        );
        assert_eq!(
            Wire::Responses.session_hint(&mut responses),
            Some(("conv", "conv_1".to_owned()))
        );
        assert!(Wire::Responses.opening(&mut responses).contains("go"));
        let mut prev = body(
            Wire::Responses,
            json!({"previous_response_id": "resp_1", "input": []}),
        );
        assert_eq!(
            Wire::Responses.previous_response(&mut prev).as_deref(),
            Some("resp_1")
        );
    }
}
