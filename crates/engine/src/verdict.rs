//! What the engine tells the host to do.

use std::borrow::Cow;

pub use loopguard_rules::Action;

/// A reference to one observed tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRef {
    /// 1-based index of the call among all calls the session has seen (since it started or was
    /// reset).
    pub seq: u64,
    /// The host's call id; empty for calls older than the last few, whose ids are not kept.
    pub call_id: String,
}

/// The engine's answer to one event.
///
/// An `allow` verdict carries no message and no calls, and building it allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    pub action: Action,
    /// The rendered message for the model or user (empty for `allow`).
    pub message: String,
    /// The detector that fired (`exact_repeat`, …, or a plugin's name).
    pub detector: Option<Cow<'static, str>>,
    /// Which rule decided: `[categories.<category>/]ladders.<ladder>[<0-based step index>]`,
    /// e.g. `categories.shell/ladders.default[1]`, or `ladders.default[0]` for a tool (or text)
    /// with no category.
    pub rule: Option<String>,
    /// How many times the loop has repeated.
    pub count: u32,
    /// The calls that make up the loop, oldest first.
    pub calls: Vec<CallRef>,
    /// The first call of the loop, so a host can rewind history to before it.
    pub loop_start: Option<CallRef>,
}

impl Verdict {
    pub fn allow() -> Verdict {
        Verdict::default()
    }

    pub fn is_allow(&self) -> bool {
        self.action == Action::Allow
    }
}
