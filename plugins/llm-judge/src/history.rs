//! The conversation as the judge sees it: a bounded record per session, and the slice sent with a
//! check — the last entries, trimmed so it neither ends on a call still waiting for its result nor
//! starts on a result whose call was cut off, preceded by the original request.

use std::collections::VecDeque;

use crate::mask::mask_secrets;

/// One entry of the history (a person's message is not an entry: it starts a new history, as
/// the request the entries answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The assistant's text.
    Assistant(String),
    /// A tool call.
    Call {
        /// The call's id.
        id: String,
        /// The tool.
        tool: String,
        /// Its arguments as text.
        arguments: String,
    },
    /// A tool's result.
    Result {
        /// The id of the call it answers.
        id: String,
        /// The output.
        output: String,
        /// Whether it failed.
        error: bool,
    },
}

/// Size bounds of the history, all policy parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Entries sent with a check.
    pub entries: usize,
    /// Characters kept of any one entry (head and tail, the middle elided).
    pub entry_chars: usize,
    /// Characters sent in all; the oldest entries go first.
    pub total_chars: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            entries: 20,
            entry_chars: 2_000,
            total_chars: 24_000,
        }
    }
}

/// What one session has said and done since its current prompt.
#[derive(Clone, Debug, Default)]
pub struct History {
    request: Option<String>,
    entries: VecDeque<Entry>,
}

impl History {
    /// A new user prompt: it becomes the original request, and earlier entries are dropped.
    pub fn new_prompt(&mut self, text: &str, limits: &Limits) {
        self.entries.clear();
        self.request = Some(clip(&mask_secrets(text), limits.entry_chars * 2));
    }

    /// Adds an entry (masked and clipped), dropping the oldest beyond what trimming needs.
    pub fn push(&mut self, entry: Entry, limits: &Limits) {
        let entry = match entry {
            Entry::Assistant(t) => Entry::Assistant(clip(&mask_secrets(&t), limits.entry_chars)),
            Entry::Call {
                id,
                tool,
                arguments,
            } => Entry::Call {
                id,
                tool,
                arguments: clip(&mask_secrets(&arguments), limits.entry_chars),
            },
            Entry::Result { id, output, error } => Entry::Result {
                id,
                output: clip(&mask_secrets(&output), limits.entry_chars),
                error,
            },
        };
        // Keep a few more than are sent, so trimming has room.
        let keep = limits.entries.saturating_mul(2).max(4);
        while self.entries.len() >= keep {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// The request the entries answer (the latest person's message).
    pub fn request(&self) -> Option<&str> {
        self.request.as_deref()
    }

    /// The entries sent with a check.
    pub fn window(&self, limits: &Limits) -> Vec<Entry> {
        let all: Vec<&Entry> = self.entries.iter().collect();
        let start = all.len().saturating_sub(limits.entries);
        let mut w: Vec<Entry> = all[start..].iter().map(|e| (*e).clone()).collect();
        // Not ending on a call whose result has not arrived.
        while let Some(Entry::Call { id, .. }) = w.last() {
            let id = id.clone();
            let answered = w
                .iter()
                .any(|e| matches!(e, Entry::Result { id: r, .. } if *r == id));
            if answered {
                break;
            }
            w.pop();
        }
        // Not starting on a result whose call was cut off.
        while let Some(Entry::Result { id, .. }) = w.first() {
            let id = id.clone();
            if w.iter()
                .any(|e| matches!(e, Entry::Call { id: c, .. } if *c == id))
            {
                break;
            }
            w.remove(0);
        }
        // The size cap: drop the oldest entries (and any result left orphaned by that).
        let size = |w: &[Entry]| w.iter().map(entry_len).sum::<usize>();
        while size(&w) > limits.total_chars && !w.is_empty() {
            w.remove(0);
            while let Some(Entry::Result { .. }) = w.first() {
                w.remove(0);
            }
        }
        w
    }
}

fn entry_len(e: &Entry) -> usize {
    match e {
        Entry::Assistant(t) => t.len(),
        Entry::Call {
            tool, arguments, ..
        } => tool.len() + arguments.len(),
        Entry::Result { output, .. } => output.len(),
    }
}

/// Keeps at most `max` characters: the head and the tail, the middle elided.
pub fn clip(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let half = max / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(n - half).collect();
    format!("{head}\n[… {} characters elided …]\n{tail}", n - 2 * half)
}

/// Renders the window as the text the judge reads.
pub fn render(request: Option<&str>, window: &[Entry]) -> String {
    let mut out = String::new();
    if let Some(r) = request {
        out.push_str("ORIGINAL USER REQUEST:\n");
        out.push_str(r);
        out.push_str("\n\n");
    }
    out.push_str("RECENT HISTORY (oldest first):\n");
    for (i, e) in window.iter().enumerate() {
        let line = match e {
            Entry::Assistant(t) => format!("[{}] ASSISTANT: {t}", i + 1),
            Entry::Call {
                tool, arguments, ..
            } => format!("[{}] TOOL CALL {tool}({arguments})", i + 1),
            Entry::Result { output, error, .. } => format!(
                "[{}] TOOL RESULT{}: {output}",
                i + 1,
                if *error { " (error)" } else { "" }
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn call(id: &str) -> Entry {
        Entry::Call {
            id: id.into(),
            tool: "bash".into(),
            arguments: "{\"command\":\"ls\"}".into(),
        }
    }

    fn result(id: &str) -> Entry {
        Entry::Result {
            id: id.into(),
            output: "a b".into(),
            error: false,
        }
    }

    #[test]
    fn the_window_neither_ends_on_a_dangling_call_nor_starts_on_an_orphan_result() {
        let limits = Limits {
            entries: 4,
            ..Limits::default()
        };
        let mut h = History::default();
        h.new_prompt("fix the build", &limits);
        for e in [
            call("1"),
            result("1"),
            call("2"),
            result("2"),
            Entry::Assistant("ok".into()),
            call("3"),
        ] {
            h.push(e, &limits);
        }
        // The last 4: result 1?? no — [call 2, result 2, text, call 3]; call 3 is dangling.
        let w = h.window(&limits);
        assert_eq!(
            w,
            vec![call("2"), result("2"), Entry::Assistant("ok".into())]
        );
        h.push(result("3"), &limits);
        h.push(call("4"), &limits);
        h.push(result("4"), &limits);
        // Last 4: [call 3, result 3, call 4, result 4].
        assert_eq!(
            h.window(&limits),
            vec![call("3"), result("3"), call("4"), result("4")]
        );
        h.push(Entry::Assistant("hm".into()), &limits);
        // Last 4: [result 3, call 4, result 4, text]: the orphan result goes.
        assert_eq!(
            h.window(&limits),
            vec![call("4"), result("4"), Entry::Assistant("hm".into())]
        );
        assert_eq!(h.request(), Some("fix the build"));
    }

    #[test]
    fn the_size_is_capped() {
        let limits = Limits {
            entries: 20,
            entry_chars: 100,
            total_chars: 250,
        };
        let mut h = History::default();
        for i in 0..10 {
            h.push(Entry::Assistant(format!("{i}{}", "x".repeat(500))), &limits);
        }
        let w = h.window(&limits);
        let total: usize = w.iter().map(entry_len).sum();
        assert!(total <= 250, "{total}");
        assert!(!w.is_empty());
        // The newest entries are the ones kept.
        assert!(matches!(w.last(), Some(Entry::Assistant(t)) if t.starts_with('9')));
    }

    #[test]
    fn secrets_are_masked_on_the_way_in() {
        let limits = Limits::default();
        let mut h = History::default();
        h.push(
            Entry::Result {
                id: "1".into(),
                output: "export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789".into(),
                error: false,
            },
            &limits,
        );
        let text = render(
            None,
            &h.window(&Limits {
                entries: 20,
                ..limits
            }),
        );
        assert!(!text.contains("abcdefghijklmnop"), "{text}");
    }
}
