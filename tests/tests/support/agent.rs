//! A small agent loop over raw HTTP for the Anthropic Messages and OpenAI Responses routes: it
//! keeps every byte the client received, so that a test can check what no client library
//! shows (a call withheld from every event of a stream), and assembles each turn, whole or
//! streamed, into the text and calls an agent would act on. Every call it is given is run and
//! fails with [`TOOL_OUTPUT`]; a turn without calls is answered "Go on.".

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Proxy, client};

/// What every tool the agent runs answers.
pub const TOOL_OUTPUT: &str = "error: could not compile `app`";

/// The first message of every conversation.
pub const TASK: &str = "build the project";

/// The person's answer to a turn without calls.
pub const GO_ON: &str = "Go on.";

/// A wire format the loop speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Anthropic Messages: the whole conversation in every request.
    Messages,
    /// OpenAI Responses. `chain`: each request continues the previous response
    /// (`previous_response_id`) with only what is new, and no session header (the proxy follows
    /// the chain); otherwise the whole conversation as `input`, with `store: false`.
    Responses {
        /// Whether requests continue the stored previous response.
        chain: bool,
    },
}

impl Format {
    /// The route on the proxy (and on the fake upstream: `messages` or `responses`).
    pub fn route(self) -> &'static str {
        match self {
            Format::Messages => "messages",
            Format::Responses { .. } => "responses",
        }
    }
}

/// A call the client was given.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// `tool_use` id, or Responses `call_id`.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments, parsed.
    pub input: Value,
}

/// A trace of a call in a stream event.
#[derive(Clone, Debug, PartialEq)]
pub enum Trace {
    /// A call's id.
    Id(String),
    /// A fragment of a call's arguments (an `input_json_delta`, a
    /// `function_call_arguments.delta`).
    Fragment(String),
    /// A call's whole arguments (a Responses call item).
    Arguments(String),
}

/// What one request got back.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The HTTP status.
    pub status: StatusCode,
    /// Every byte of the body.
    pub raw: String,
    /// The `x-loopguard-action` header, if any.
    pub action: Option<String>,
    /// The assistant's text blocks (or message items), in order.
    pub text: Vec<String>,
    /// The calls to run, in order.
    pub calls: Vec<Call>,
    /// The error object (`error` of the envelope, or of a stream's error event).
    pub error: Option<Value>,
    /// The `loopguard` field the proxy adds to what it changed (`Null` when absent).
    pub loopguard: Value,
    /// The response's id (Responses) or the message's (Messages).
    pub id: Option<String>,
    /// Every call id and call argument any event of a stream carried: a withheld call must
    /// leave no trace.
    pub traces: Vec<Trace>,
    /// The assistant's side of the turn as the next request carries it: a Messages `content`
    /// array, or the Responses output items.
    pub answer: Value,
}

/// One conversation with the proxy.
#[derive(Debug)]
pub struct Conversation {
    /// The wire format.
    pub format: Format,
    /// Whether every request asks for a stream.
    pub stream: bool,
    /// The model (the fake upstream's script).
    pub model: String,
    /// The `x-session-id` header (none in Responses chain mode).
    pub session: Option<String>,
    /// The `x-request-id` header of the next request, if any.
    pub request_id: Option<String>,
    /// Every message (Messages) or input item (Responses) the client sent or was given, in
    /// order: the conversation as the client sees it.
    pub history: Vec<Value>,
    /// Responses chain mode: the items of the next request, and the response it continues.
    new: Vec<Value>,
    previous: Option<String>,
}

impl Conversation {
    /// A conversation that starts with [`TASK`].
    pub fn new(format: Format, model: &str, stream: bool, session: &str) -> Conversation {
        let first = json!({"role": "user", "content": TASK});
        Conversation {
            format,
            stream,
            model: model.to_owned(),
            session: (format != Format::Responses { chain: true }).then(|| session.to_owned()),
            request_id: None,
            history: vec![first.clone()],
            new: vec![first],
            previous: None,
        }
    }

    /// The agent's move after the latest answer, as the next request carries it: the results
    /// of the calls it ran, or "Go on.".
    pub fn moves(&self) -> &[Value] {
        &self.new
    }

    /// The body of the next request.
    pub fn request(&self) -> Value {
        match self.format {
            Format::Messages => json!({"model": self.model, "max_tokens": 256,
                "messages": self.history, "stream": self.stream}),
            Format::Responses { chain: true } => {
                let mut body = json!({"model": self.model, "input": self.new,
                    "stream": self.stream});
                if let Some(p) = &self.previous {
                    body["previous_response_id"] = json!(p);
                }
                body
            }
            Format::Responses { chain: false } => json!({"model": self.model,
                "input": self.history, "store": false, "stream": self.stream}),
        }
    }

    /// Sends the next request, reads what came back and, unless it is an error, adds the
    /// answer and what the agent does about it (the failed calls' results, or "Go on.") to
    /// the conversation.
    pub async fn turn(&mut self, p: &Proxy) -> Turn {
        let mut req = client()
            .post(p.url(&format!("/v1/{}", self.format.route())))
            .header("authorization", "Bearer sk-test")
            .json(&self.request());
        if self.format == Format::Messages {
            req = req.header("anthropic-version", "2023-06-01");
        }
        if let Some(s) = &self.session {
            req = req.header("x-session-id", s);
        }
        if let Some(id) = &self.request_id {
            req = req.header("x-request-id", id);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let action = resp
            .headers()
            .get("x-loopguard-action")
            .map(|v| v.to_str().unwrap().to_owned());
        let streamed = resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let raw = resp.text().await.unwrap();
        let mut turn = Turn {
            status,
            raw: raw.clone(),
            action,
            text: Vec::new(),
            calls: Vec::new(),
            error: None,
            loopguard: Value::Null,
            id: None,
            traces: Vec::new(),
            answer: Value::Null,
        };
        if !status.is_success() {
            let body: Value = serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{e}: {raw}"));
            turn.error = Some(body["error"].clone());
            return turn;
        }
        let whole = if streamed {
            assert!(self.stream, "a stream only when asked for: {raw}");
            self.assemble(&raw, &mut turn)
        } else {
            assert!(!self.stream, "asked for a stream, got: {raw}");
            Some(serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{e}: {raw}")))
        };
        let Some(whole) = whole else {
            return turn;
        };
        self.read_whole(&whole, &mut turn);
        self.answered(&turn);
        turn
    }

    /// Reads a whole message or response into `turn`.
    fn read_whole(&self, whole: &Value, turn: &mut Turn) {
        turn.id = whole["id"].as_str().map(str::to_owned);
        turn.loopguard = whole.get("loopguard").cloned().unwrap_or(Value::Null);
        match self.format {
            Format::Messages => {
                let content = whole["content"].as_array().unwrap();
                for b in content {
                    match b["type"].as_str().unwrap() {
                        "text" => turn.text.push(b["text"].as_str().unwrap().to_owned()),
                        "tool_use" => turn.calls.push(Call {
                            id: b["id"].as_str().unwrap().to_owned(),
                            name: b["name"].as_str().unwrap().to_owned(),
                            input: b["input"].clone(),
                        }),
                        other => panic!("unexpected block {other}: {whole}"),
                    }
                }
                turn.answer = Value::Array(content.clone());
            }
            Format::Responses { .. } => {
                let output = whole["output"].as_array().unwrap();
                for item in output {
                    match item["type"].as_str().unwrap() {
                        "message" => turn.text.push(
                            item["content"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .filter_map(|p| p["text"].as_str())
                                .collect(),
                        ),
                        "function_call" => turn.calls.push(Call {
                            id: item["call_id"].as_str().unwrap().to_owned(),
                            name: item["name"].as_str().unwrap().to_owned(),
                            input: serde_json::from_str(item["arguments"].as_str().unwrap())
                                .unwrap(),
                        }),
                        other => panic!("unexpected item {other}: {whole}"),
                    }
                }
                turn.answer = Value::Array(output.clone());
            }
        }
    }

    /// Assembles a stream into the whole message or response it delivers, checking that what
    /// its deltas delivered is what its final object says; `None` (and `turn.error`) when the
    /// stream ended with an error event.
    fn assemble(&self, raw: &str, turn: &mut Turn) -> Option<Value> {
        let mut message: Option<Value> = None;
        let mut blocks: Vec<Value> = Vec::new();
        let mut json_of: Vec<String> = Vec::new();
        let mut completed: Option<Value> = None;
        let mut delta_text = String::new();
        for event in raw.split("\n\n").filter(|e| !e.trim().is_empty()) {
            let mut name = None;
            let mut data = String::new();
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n);
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                } else {
                    assert!(line.starts_with(':'), "not SSE: {line:?} in {raw}");
                }
            }
            if data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
            let ty = v["type"].as_str().unwrap_or_default();
            assert_eq!(name, Some(ty), "the event's name is its type: {event}");
            if ty == "error" {
                turn.error = Some(v["error"].clone());
                return None;
            }
            match self.format {
                Format::Messages => match ty {
                    "message_start" => message = Some(v["message"].clone()),
                    "content_block_start" => {
                        let i = v["index"].as_u64().unwrap() as usize;
                        assert_eq!(i, blocks.len(), "dense block indices: {raw}");
                        let block = v["content_block"].clone();
                        if let Some(id) = block["id"].as_str() {
                            turn.traces.push(Trace::Id(id.to_owned()));
                        }
                        blocks.push(block);
                        json_of.push(String::new());
                    }
                    "content_block_delta" => {
                        let i = v["index"].as_u64().unwrap() as usize;
                        let d = &v["delta"];
                        match d["type"].as_str().unwrap() {
                            "text_delta" => {
                                let t = d["text"].as_str().unwrap();
                                let text = blocks[i]["text"].as_str().unwrap().to_owned() + t;
                                blocks[i]["text"] = json!(text);
                            }
                            "input_json_delta" => {
                                let piece = d["partial_json"].as_str().unwrap();
                                turn.traces.push(Trace::Fragment(piece.to_owned()));
                                json_of[i].push_str(piece);
                            }
                            other => panic!("unexpected delta {other}"),
                        }
                    }
                    "content_block_stop" => {
                        let i = v["index"].as_u64().unwrap() as usize;
                        if blocks[i]["type"] == "tool_use" && !json_of[i].is_empty() {
                            blocks[i]["input"] = serde_json::from_str(&json_of[i]).unwrap();
                        }
                    }
                    "message_delta" => {
                        let m = message.as_mut().expect("message_start first");
                        m["stop_reason"] = v["delta"]["stop_reason"].clone();
                        if let Some(lg) = v.get("loopguard") {
                            m["loopguard"] = lg.clone();
                        }
                    }
                    "message_stop" | "ping" => {}
                    other => panic!("unexpected event {other}"),
                },
                Format::Responses { .. } => {
                    let item = &v["item"];
                    if let Some(id) = item["call_id"].as_str() {
                        turn.traces.push(Trace::Id(id.to_owned()));
                    }
                    if let Some(args) = item["arguments"].as_str().filter(|a| !a.is_empty()) {
                        turn.traces.push(Trace::Arguments(args.to_owned()));
                    }
                    match ty {
                        "response.output_text.delta" => {
                            delta_text.push_str(v["delta"].as_str().unwrap());
                        }
                        "response.function_call_arguments.delta" => {
                            let piece = v["delta"].as_str().unwrap();
                            turn.traces.push(Trace::Fragment(piece.to_owned()));
                        }
                        "response.completed" => completed = Some(v["response"].clone()),
                        _ => {}
                    }
                }
            }
        }
        match self.format {
            Format::Messages => {
                let mut m = message.expect("a message_start");
                m["content"] = Value::Array(blocks);
                Some(m)
            }
            Format::Responses { .. } => {
                let r = completed.expect("a response.completed event");
                // The text deltas delivered what the final response says.
                let mut text = String::new();
                for item in r["output"].as_array().unwrap() {
                    for p in item["content"].as_array().into_iter().flatten() {
                        text.push_str(p["text"].as_str().unwrap_or_default());
                    }
                }
                // The proxy's own note (after the model's text) may come without deltas.
                assert!(text.starts_with(&delta_text), "{raw}");
                Some(r)
            }
        }
    }

    /// Adds the answer to the conversation, and the agent's next move: every call run (and
    /// failed), or "Go on." when there was none.
    fn answered(&mut self, turn: &Turn) {
        let mut next = Vec::new();
        match self.format {
            Format::Messages => {
                self.history
                    .push(json!({"role": "assistant", "content": turn.answer}));
                if turn.calls.is_empty() {
                    next.push(json!({"role": "user", "content": GO_ON}));
                } else {
                    let results: Vec<Value> = turn
                        .calls
                        .iter()
                        .map(|c| {
                            json!({"type": "tool_result", "tool_use_id": c.id,
                                "content": TOOL_OUTPUT, "is_error": true})
                        })
                        .collect();
                    next.push(json!({"role": "user", "content": results}));
                }
            }
            Format::Responses { .. } => {
                self.history
                    .extend(turn.answer.as_array().unwrap().iter().cloned());
                if turn.calls.is_empty() {
                    next.push(json!({"role": "user", "content": GO_ON}));
                } else {
                    for c in &turn.calls {
                        next.push(json!({"type": "function_call_output", "call_id": c.id,
                            "output": TOOL_OUTPUT}));
                    }
                }
                self.previous.clone_from(&turn.id);
            }
        }
        self.history.extend(next.iter().cloned());
        self.new = next;
    }
}
