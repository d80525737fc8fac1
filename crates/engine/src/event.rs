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
    pub session: &'a str,
    /// The host's id of this call (`tool_call_id`); results refer to it.
    pub call_id: &'a str,
    pub tool: &'a str,
    pub arguments: Arguments<'a>,
    pub time_ms: u64,
}

/// A tool produced its output.
#[derive(Clone, Copy, Debug)]
pub struct ToolResult<'a> {
    pub session: &'a str,
    pub call_id: &'a str,
    pub output: &'a str,
    pub is_error: bool,
    pub exit_code: Option<i32>,
    pub time_ms: u64,
}

/// Assistant text with no tool call: a whole turn, or one chunk of a streamed turn.
#[derive(Clone, Copy, Debug)]
pub struct Text<'a> {
    pub session: &'a str,
    pub text: &'a str,
    /// A streamed chunk; the turn ends with a chunk whose `end_of_turn` is true.
    pub chunk: bool,
    pub end_of_turn: bool,
    /// Reasoning-only text (thinking), not shown to the user.
    pub reasoning: bool,
    /// The text accompanies tool calls in the same assistant message ("Let me read the next
    /// file"): narration is never a text loop on its own (the calls are judged as calls), and
    /// the turn is not a turn without action.
    pub narration: bool,
    pub time_ms: u64,
}

/// A message from a person, or a user-role message the host or framework sent itself.
#[derive(Clone, Copy, Debug)]
pub struct UserMessage<'a> {
    pub session: &'a str,
    pub text: &'a str,
    /// The host or framework sent it (a nudge, a "continue" prompt, an observation), not a
    /// person: it changes no count. Messages matching the policy's `user.automated_patterns`
    /// are treated the same way.
    pub injected: bool,
    pub time_ms: u64,
}

/// One event of an agent loop.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    Call(Call<'a>),
    Result(ToolResult<'a>),
    Text(Text<'a>),
    User(UserMessage<'a>),
    /// Forget everything about the session.
    Reset {
        session: &'a str,
        time_ms: u64,
    },
}

impl<'a> Event<'a> {
    pub fn session(&self) -> &'a str {
        match self {
            Event::Call(c) => c.session,
            Event::Result(r) => r.session,
            Event::Text(t) => t.session,
            Event::User(u) => u.session,
            Event::Reset { session, .. } => session,
        }
    }

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
