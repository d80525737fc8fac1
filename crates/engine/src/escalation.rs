//! Escalation: a detection becomes an action through a ladder.
//!
//! Each loop (identified by its loop key) keeps how many times it was detected; the ladder step
//! is chosen by that count and by how often the session was flagged before. A loop is escalated
//! at most once per call (or text turn), so a call flagged by `exact_repeat` is not escalated
//! again when its result arrives and `no_progress` sees the same loop.

use loopguard_rules::{Action, Ladder, Step};

use crate::compiled::CompiledRules;
use crate::detect::{Det, Detection};

/// Loops remembered per session; the least recently escalated is forgotten first.
const MAX_LOOPS: usize = 32;

#[derive(Clone, Copy, Debug)]
struct LoopEntry {
    key: u64,
    repeat: u32,
    occasion: u64,
}

/// Per-loop detection counters of one session.
#[derive(Clone, Debug, Default)]
pub struct Loops {
    entries: Vec<LoopEntry>,
}

impl Loops {
    /// The repeat number the loop would get now; `None` when it was already escalated on this
    /// occasion.
    pub fn prospective(&self, key: u64, occasion: u64) -> Option<u32> {
        match self.entries.iter().find(|e| e.key == key) {
            Some(e) if e.occasion == occasion => None,
            Some(e) => Some(e.repeat.saturating_add(1)),
            None => Some(1),
        }
    }

    /// Counts a detection of the loop; returns its repeat number.
    pub fn commit(&mut self, key: u64, occasion: u64) -> u32 {
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            if e.occasion != occasion {
                e.repeat = e.repeat.saturating_add(1);
                e.occasion = occasion;
            }
            return e.repeat;
        }
        if self.entries.len() >= MAX_LOOPS
            && let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].occasion)
        {
            self.entries.swap_remove(oldest);
        }
        self.entries.push(LoopEntry {
            key,
            repeat: 1,
            occasion,
        });
        1
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn capacity_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<LoopEntry>()
    }

    /// The counters as `(loop key, repeat, occasion)`, in their order (for snapshots).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32, u64)> + '_ {
        self.entries.iter().map(|e| (e.key, e.repeat, e.occasion))
    }

    /// Counters from [`Loops::entries`]; at most the most recent `MAX_LOOPS` are kept.
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, u32, u64)>) -> Loops {
        let mut entries: Vec<LoopEntry> = entries
            .into_iter()
            .map(|(key, repeat, occasion)| LoopEntry {
                key,
                repeat,
                occasion,
            })
            .collect();
        let extra = entries.len().saturating_sub(MAX_LOOPS);
        entries.drain(..extra);
        Loops { entries }
    }

    /// How many loops at most a session remembers.
    pub const CAPACITY: usize = MAX_LOOPS;
}

/// A loop found on an event, by a built-in detector or by a plugin: both go through the same
/// ladders ([`decide`]) and become a verdict the same way (`Session::escalate`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Found<'a> {
    /// A built-in detector's detection.
    Builtin(Detection),
    /// A plugin's detection.
    Plugin(PluginFound<'a>),
}

/// What a plugin found, with what escalation needs to know about the plugin.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PluginFound<'a> {
    /// The plugin's name as verdicts show it.
    pub name: &'a str,
    /// The ladder the policy gave the plugin, if any.
    pub ladder: Option<&'a str>,
    /// The loop's key, tagged with the plugin's so that plugins never share a counter.
    pub loop_key: u64,
    pub count: u32,
    /// The tool of the call the event is about, if any.
    pub tool: Option<u16>,
    /// The plugin's own words about the loop.
    pub message: &'a str,
    /// The plugin's `{pattern}`; empty: its name.
    pub pattern: &'a str,
}

impl<'f> Found<'f> {
    /// The key of the loop's escalation counter.
    pub fn loop_key(&self) -> u64 {
        match self {
            Found::Builtin(d) => d.loop_key(),
            Found::Plugin(p) => p.loop_key,
        }
    }

    /// A loop of a whole group of workers: it has its own counters and ladder.
    pub fn is_group(&self) -> bool {
        matches!(self, Found::Builtin(d) if d.det == Det::GroupLoop)
    }

    /// The ladder the finder names itself (a detector's, the group's, a plugin's), if any.
    fn own_ladder<'a>(&self, rules: &'a CompiledRules, category: Option<usize>) -> Option<&'a str>
    where
        Self: 'a,
    {
        match self {
            Found::Builtin(d) if d.det == Det::GroupLoop => {
                Some(rules.config.group.ladder.as_str())
            }
            Found::Builtin(d) => rules.detectors(category).ladder(d.det),
            Found::Plugin(p) => p.ladder,
        }
    }

    /// The detector as verdicts name it.
    pub fn detector(&self) -> &str {
        match self {
            Found::Builtin(d) => d.det.name(),
            Found::Plugin(p) => p.name,
        }
    }

    /// The loop's `{pattern}`.
    pub fn pattern(&self) -> &str {
        match self {
            Found::Builtin(d) => d.det.pattern(),
            Found::Plugin(p) if p.pattern.is_empty() => p.name,
            Found::Plugin(p) => p.pattern,
        }
    }

    /// How many times the loop repeated.
    pub fn count(&self) -> u32 {
        match self {
            Found::Builtin(d) => d.count,
            Found::Plugin(p) => p.count,
        }
    }

    /// The `{threshold}`: the detector's; a plugin's count (plugins say when, not at what).
    pub fn threshold(&self) -> u32 {
        match self {
            Found::Builtin(d) => d.threshold,
            Found::Plugin(p) => p.count,
        }
    }

    /// The tool the loop is about, if any.
    pub fn tool(&self) -> Option<u16> {
        match self {
            Found::Builtin(d) => d.tool,
            Found::Plugin(p) => p.tool,
        }
    }

    /// What a plugin said about the loop.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Found::Builtin(_) => None,
            Found::Plugin(p) => Some(p.message),
        }
    }

    /// Failing shell file operations: the message points the model at the file tools.
    pub fn file_tools_hint(&self) -> bool {
        matches!(self, Found::Builtin(d) if d.file_tools_hint)
    }
}

/// A loop with the ladder step it would take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decision<'a> {
    pub found: Found<'a>,
    pub action: Action,
    pub ladder: &'a str,
    pub step: Option<(usize, &'a Step)>,
}

/// What the ladder says about a loop, without counting it: the step its next sighting takes
/// through the ladder it names itself, else the category's, else the policy's default; `None`
/// when it was already escalated on this occasion.
pub(crate) fn decide<'a>(
    rules: &'a CompiledRules,
    loops: &Loops,
    flags: u32,
    found: Found<'a>,
    category: Option<usize>,
    occasion: u64,
) -> Option<Decision<'a>> {
    let repeat = loops.prospective(found.loop_key(), occasion)?;
    let (ladder, steps) = rules.ladder(category, found.own_ladder(rules, category));
    let step = steps.and_then(|l: &Ladder| {
        let s = l.step(repeat, flags)?;
        let i = l.steps.iter().position(|x| std::ptr::eq(x, s))?;
        Some((i, s))
    });
    Some(Decision {
        found,
        action: step.map_or(Action::Allow, |(_, s)| s.action),
        ladder,
        step,
    })
}

/// `Verdict::rule`: the deciding step, `ladders.<ladder>[<i>]`, under its category
/// (`categories.<name>/…`) when `category_name` is given.
pub(crate) fn rule_name(category_name: &str, ladder: &str, step: Option<(usize, &Step)>) -> String {
    let i = step.map_or(0, |(i, _)| i);
    // Pieces pushed into one allocation (`format!` costs several times as much, on every
    // verdict).
    let mut rule = String::with_capacity(category_name.len() + ladder.len() + 32);
    if !category_name.is_empty() {
        rule.push_str("categories.");
        rule.push_str(category_name);
        rule.push('/');
    }
    rule.push_str("ladders.");
    rule.push_str(ladder);
    rule.push('[');
    // Writing into a `String` cannot fail.
    let _ = crate::message::push_number(&mut rule, i);
    rule.push(']');
    rule
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_counter_counts_once_per_occasion() {
        let mut l = Loops::default();
        assert_eq!(l.prospective(7, 1), Some(1));
        assert_eq!(l.commit(7, 1), 1);
        assert_eq!(l.prospective(7, 1), None);
        assert_eq!(l.commit(7, 1), 1);
        assert_eq!(l.prospective(7, 2), Some(2));
        assert_eq!(l.commit(7, 2), 2);
        for k in 0..100 {
            l.commit(1000 + k, 10 + k);
        }
        assert!(l.entries.len() <= MAX_LOOPS);
    }
}
