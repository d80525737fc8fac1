//! What the engine tells the host to do.

use std::borrow::Cow;

pub use loopguard_rules::Action;

/// A reference to one observed tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRef {
    /// 1-based index of the call among all calls the session has seen (since it started or was
    /// reset).
    pub seq: u64,
    /// The host's call id. A session keeps the ids of its 6 most recent calls and of the first
    /// calls of the last 4 loops it reported (to bound its memory); other calls have an empty
    /// id here, and `seq` only.
    pub call_id: String,
}

/// The engine's answer to one event.
///
/// An `allow` verdict carries no message and no calls, and building it allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    /// What the host should do.
    pub action: Action,
    /// The rendered message for the model or user (empty for `allow`).
    pub message: String,
    /// The detector that fired (`exact_repeat`, …, or a plugin's name; `group_loop` for a loop
    /// of a whole group of workers, `group_store` for a call refused because the group store
    /// fails closed and cannot be reached).
    pub detector: Option<Cow<'static, str>>,
    /// Which rule decided: `[categories.<category>/]ladders.<ladder>[<0-based step index>]`,
    /// e.g. `categories.shell/ladders.default[1]`, or `ladders.default[0]` for a tool (or text)
    /// with no category and for group loops (`ladders.group[0]`); `group.store` for a
    /// `group_store` refusal.
    pub rule: Option<String>,
    /// How many times the loop has repeated.
    pub count: u32,
    /// The calls that make up the loop, oldest first.
    pub calls: Vec<CallRef>,
    /// The first call of the loop, so a host can rewind history to before it.
    pub loop_start: Option<CallRef>,
    /// Things the operator should know that are not decisions, e.g. a plugin that panicked and
    /// is skipped from now on. Usually empty, also on `allow` verdicts that carry one.
    pub notes: Vec<Note>,
}

/// A remark about the engine itself attached to a verdict (for logs, never shown to the model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// A stable identifier: `plugin_poisoned` (a plugin panicked; it is skipped from now on) or
    /// `plugin_error` (a plugin returned an error status; the event went on without it).
    pub code: &'static str,
    /// The plugin's name as verdicts use it.
    pub plugin: String,
    /// One line for the operator.
    pub message: String,
}

impl Verdict {
    /// Run the call; nothing to say.
    pub fn allow() -> Verdict {
        Verdict::default()
    }

    /// Whether the verdict is `allow`.
    pub fn is_allow(&self) -> bool {
        self.action == Action::Allow
    }
}
