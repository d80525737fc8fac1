//! What a host tells the engine: the events of an agent loop.
//!
//! Events borrow their text from the host, so observing one allocates nothing the host did not
//! already have. Time is event time in milliseconds, supplied by the host, so replays are
//! deterministic.

/// The arguments of a tool call, as the model produced them.
#[derive(Clone, Copy, Debug)]
pub enum Arguments<'a> {
    /// Parsed JSON arguments.
    Json(&'a serde_json::Value),
    /// Arguments as a raw string, which may or may not parse as JSON; kept as text when it does not.
    Raw(&'a str),
}

/// The model asked for a tool to be run.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The session (one agent run) the event belongs to.
    pub session: &'a str,
    /// The host's id of this call (`tool_call_id`); results refer to it.
    pub call_id: &'a str,
    /// The tool's name as the model wrote it.
    pub tool: &'a str,
    /// The call's arguments, parsed or as the model's raw text.
    pub arguments: Arguments<'a>,
    /// Event time in milliseconds (any epoch, the same for every event of a session).
    pub time_ms: u64,
}

/// A tool produced its output.
#[derive(Clone, Copy, Debug)]
pub struct ToolResult<'a> {
    /// The session the event belongs to.
    pub session: &'a str,
    /// The id of the call this result answers.
    pub call_id: &'a str,
    /// The tool's output as the model will read it.
    pub output: &'a str,
    /// The host says the call failed.
    pub is_error: bool,
    /// The process's exit code, for shell tools; any code but 0 is a failure.
    pub exit_code: Option<i32>,
    /// Event time in milliseconds.
    pub time_ms: u64,
}

/// Assistant text with no tool call: a whole turn, or one chunk of a streamed turn.
#[derive(Clone, Copy, Debug)]
pub struct Text<'a> {
    /// The session the event belongs to.
    pub session: &'a str,
    /// The text (of the turn, or of this chunk).
    pub text: &'a str,
    /// A streamed chunk; the turn ends with a chunk whose `end_of_turn` is true.
    pub chunk: bool,
    /// The turn is complete with this text.
    pub end_of_turn: bool,
    /// Reasoning-only text (thinking), not shown to the user.
    pub reasoning: bool,
    /// The text accompanies tool calls in the same assistant message ("Let me read the next
    /// file"): narration is never a text loop on its own (the calls are judged as calls), and
    /// the turn is not a turn without action.
    pub narration: bool,
    /// Event time in milliseconds.
    pub time_ms: u64,
}

/// A message from a person, or a user-role message the host or framework sent itself.
#[derive(Clone, Copy, Debug)]
pub struct UserMessage<'a> {
    /// The session the event belongs to.
    pub session: &'a str,
    /// The message's text.
    pub text: &'a str,
    /// The host or framework sent it (a nudge, a "continue" prompt, an observation), not a
    /// person: it changes no count. Messages matching the policy's `user.automated_patterns`
    /// are treated the same way.
    pub injected: bool,
    /// Event time in milliseconds.
    pub time_ms: u64,
}

/// One event of an agent loop.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// The model asked for a tool to be run.
    Call(Call<'a>),
    /// A tool produced its output.
    Result(ToolResult<'a>),
    /// Assistant text.
    Text(Text<'a>),
    /// A user-role message.
    User(UserMessage<'a>),
    /// Forget everything about the session.
    Reset {
        /// The session to forget.
        session: &'a str,
        /// Event time in milliseconds.
        time_ms: u64,
    },
}

impl<'a> Event<'a> {
    /// The session the event belongs to.
    pub fn session(&self) -> &'a str {
        match self {
            Event::Call(c) => c.session,
            Event::Result(r) => r.session,
            Event::Text(t) => t.session,
            Event::User(u) => u.session,
            Event::Reset { session, .. } => session,
        }
    }

    /// The event's time in milliseconds.
    pub fn time_ms(&self) -> u64 {
        match self {
            Event::Call(c) => c.time_ms,
            Event::Result(r) => r.time_ms,
            Event::Text(t) => t.time_ms,
            Event::User(u) => u.time_ms,
            Event::Reset { time_ms, .. } => *time_ms,
        }
    }
}
