//! Escalation: a detection becomes an action through a ladder.
//!
//! Each loop (identified by its loop key) keeps how many times it was detected; the ladder step
//! is chosen by that count and by how often the session was flagged before. A loop is escalated
//! at most once per call (or text turn), so a call flagged by `exact_repeat` is not escalated
//! again when its result arrives and `no_progress` sees the same loop.

use std::fmt::Write;

use loopguard_rules::{Action, Detectors, Ladder, Step};

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

/// The detector's own ladder choice.
pub fn detector_ladder(d: &Detectors, det: Det) -> Option<&str> {
    match det {
        Det::ExactRepeat => d.exact_repeat.ladder.as_deref(),
        Det::FuzzyRepeat => d.fuzzy_repeat.ladder.as_deref(),
        Det::Cycle => d.cycle.ladder.as_deref(),
        Det::Interleaved => d.interleaved.ladder.as_deref(),
        Det::NoProgress => d.no_progress.ladder.as_deref(),
        Det::SameOutcome => d.same_outcome.ladder.as_deref(),
        Det::ErrorCascade => d.error_cascade.ladder.as_deref(),
        Det::TestFix => d.test_fix.ladder.as_deref(),
        Det::Monologue => d.monologue.ladder.as_deref(),
        Det::TextRepeat => d.text_repeat.ladder.as_deref(),
        Det::Chanting => d.chanting.ladder.as_deref(),
        Det::UnknownTool => d.unknown_tool.ladder.as_deref(),
        // The group ladder is in the policy's `group` section: see [`decide`].
        Det::GroupLoop => None,
    }
}

/// A detection with the ladder step it would take.
#[derive(Clone, Copy, Debug)]
pub struct Decision<'r> {
    pub detection: Detection,
    pub action: Action,
    pub ladder: &'r str,
    pub step: Option<(usize, &'r Step)>,
}

/// The step a loop's `repeat`th sighting takes, and the ladder's name: the ladder `own` names
/// (a detector's or a plugin's), else the category's, else the policy's default. Built-in and
/// plugin detections both go through here.
pub fn ladder_step<'r>(
    rules: &'r CompiledRules,
    category: Option<usize>,
    own: Option<&'r str>,
    repeat: u32,
    flags: u32,
) -> (&'r str, Option<(usize, &'r Step)>) {
    let (name, ladder) = rules.ladder(category, own);
    let step = ladder.and_then(|l: &Ladder| {
        let s = l.step(repeat, flags)?;
        let i = l.steps.iter().position(|x| std::ptr::eq(x, s))?;
        Some((i, s))
    });
    (name, step)
}

/// `Verdict::rule`: the deciding step, `ladders.<ladder>[<i>]`, under its category
/// (`categories.<name>/…`) when `category_name` is given.
pub fn rule_name(category_name: &str, ladder: &str, step: Option<(usize, &Step)>) -> String {
    let i = step.map_or(0, |(i, _)| i);
    if category_name.is_empty() {
        format!("ladders.{ladder}[{i}]")
    } else {
        format!("categories.{category_name}/ladders.{ladder}[{i}]")
    }
}

/// A verdict's message: the step's template, else the action's default, rendered with `vars`.
/// `detail` is what a plugin found (a judge's analysis): after the step's wording, or, when the
/// step has none, worded for the action in place of the default.
pub fn message(
    step: Option<(usize, &Step)>,
    action: Action,
    vars: &Vars<'_>,
    detail: Option<&str>,
) -> String {
    let detail = detail.map(str::trim).filter(|d| !d.is_empty());
    match (step.and_then(|(_, s)| s.message.as_deref()), detail) {
        (Some(template), Some(d)) => format!("{} Details: {d}", render(template, vars)),
        (Some(template), None) => render(template, vars),
        (None, Some(d)) => own_message(action, d),
        (None, None) => render(default_message(action), vars),
    }
}

/// A plugin's own finding, worded for the action.
fn own_message(action: Action, message: &str) -> String {
    let m = message.trim_end_matches('.');
    match action {
        Action::Allow => String::new(),
        Action::Warn => format!(
            "{m}. Stop repeating it: change the arguments, try a different tool, or explain what is blocking you."
        ),
        Action::Ask => format!("{m}. Ask the user whether to continue."),
        Action::Block => format!("Refused: {m}. The call was not run. Change your approach."),
        Action::Terminate => format!("Stopped: {m}."),
    }
}

/// What the ladder says about a detection, without counting it.
pub fn decide<'r>(
    rules: &'r CompiledRules,
    loops: &Loops,
    flags: u32,
    d: &Detection,
    category: Option<usize>,
    occasion: u64,
) -> Option<Decision<'r>> {
    let repeat = loops.prospective(d.loop_key(), occasion)?;
    let own = match d.det {
        Det::GroupLoop => Some(rules.config.group.ladder.as_str()),
        det => detector_ladder(rules.detectors(category), det),
    };
    let (name, step) = ladder_step(rules, category, own, repeat, flags);
    Some(Decision {
        detection: *d,
        action: step.map_or(Action::Allow, |(_, s)| s.action),
        ladder: name,
        step,
    })
}

/// Values for a message template's placeholders.
#[derive(Debug)]
pub struct Vars<'a> {
    pub tool: &'a str,
    pub count: u32,
    pub detector: &'a str,
    pub rule: &'a str,
    pub pattern: &'a str,
    pub category: &'a str,
    pub threshold: u32,
    pub window: usize,
    pub file: &'a str,
    pub flags: u32,
    pub action: &'a str,
    /// Distinct workers of the swarm that made the call (group loops); 1 for a session's own
    /// loops.
    pub workers: u32,
}

/// The message used when a ladder step has none.
pub fn default_message(action: Action) -> &'static str {
    match action {
        Action::Allow => "",
        Action::Warn => {
            "{tool} was repeated {count} times ({detector}). Stop repeating it: change the arguments, try a different tool, or explain what is blocking you."
        }
        Action::Ask => {
            "{tool} was repeated {count} times ({detector}). Ask the user whether to continue."
        }
        Action::Block => {
            "Refused: {tool} was repeated {count} times ({detector}). The call was not run. Change your approach."
        }
        Action::Terminate => {
            "Stopped: the agent kept looping on {tool} ({detector}, {count} times)."
        }
    }
}

/// Renders a template: `{name}` placeholders are replaced, `{{` and `}}` are literal braces,
/// unknown placeholders are kept as written.
pub fn render(template: &str, v: &Vars<'_>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let r = &rest[i..];
        if r.starts_with("{{") || r.starts_with("}}") {
            out.push_str(&r[..1]);
            rest = &r[2..];
            continue;
        }
        if r.starts_with('{')
            && let Some(end) = r.find('}')
            && placeholder(&mut out, &r[1..end], v)
        {
            rest = &r[end + 1..];
            continue;
        }
        out.push_str(&r[..1]);
        rest = &r[1..];
    }
    out.push_str(rest);
    out
}

fn placeholder(out: &mut String, name: &str, v: &Vars<'_>) -> bool {
    let _ = match name {
        "tool" => out.write_str(v.tool),
        "count" => write!(out, "{}", v.count),
        "detector" => out.write_str(v.detector),
        "rule" => out.write_str(v.rule),
        "pattern" => out.write_str(v.pattern),
        "category" => out.write_str(v.category),
        "threshold" => write!(out, "{}", v.threshold),
        "window" => write!(out, "{}", v.window),
        "file" => out.write_str(v.file),
        "flags" => write!(out, "{}", v.flags),
        "action" => out.write_str(v.action),
        "workers" => write!(out, "{}", v.workers),
        _ => return false,
    };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars<'static> {
        Vars {
            tool: "bash",
            count: 3,
            detector: "exact_repeat",
            rule: "ladders.default[0]",
            pattern: "p",
            category: "shell",
            threshold: 3,
            window: 30,
            file: "a.rs",
            flags: 1,
            action: "warn",
            workers: 1,
        }
    }

    #[test]
    fn renders_placeholders() {
        let s = render(
            "{tool} x{count} {{literal}} {unknown} {file} {action} {",
            &vars(),
        );
        assert_eq!(s, "bash x3 {literal} {unknown} a.rs warn {");
        assert_eq!(
            render(default_message(Action::Block), &vars()).get(..8),
            Some("Refused:")
        );
    }

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
