//! Every message the engine writes, in one place: a verdict's message from its ladder step's
//! template (or the action's default), a plugin's finding worded for the action, the hint to
//! use the file tools, the warning that a refusal waits for the next call, the refusal of a
//! call the group store cannot check, and the operator notes about plugins.
//!
//! Templates name their values with `{placeholder}`s; the placeholders a policy may use are
//! declared once, in `loopguard_rules::schema::PLACEHOLDERS`, and [`FILLERS`] fills exactly
//! those (a test holds the two lists equal).

use std::fmt::Write;

use loopguard_rules::{Action, Step};

/// Values for a message template's placeholders.
#[derive(Debug)]
pub(crate) struct Vars<'a> {
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

/// Writes one placeholder's value.
type Fill = fn(&mut String, &Vars<'_>) -> std::fmt::Result;

/// What fills each placeholder, by name: the placeholders of
/// `loopguard_rules::schema::PLACEHOLDERS`, no more, no fewer.
const FILLERS: &[(&str, Fill)] = &[
    ("tool", |o, v| o.write_str(v.tool)),
    ("count", |o, v| push_number(o, v.count as usize)),
    ("detector", |o, v| o.write_str(v.detector)),
    ("rule", |o, v| o.write_str(v.rule)),
    ("pattern", |o, v| o.write_str(v.pattern)),
    ("category", |o, v| o.write_str(v.category)),
    ("threshold", |o, v| push_number(o, v.threshold as usize)),
    ("window", |o, v| push_number(o, v.window)),
    ("file", |o, v| o.write_str(v.file)),
    ("flags", |o, v| push_number(o, v.flags as usize)),
    ("action", |o, v| o.write_str(v.action)),
    ("workers", |o, v| push_number(o, v.workers as usize)),
];

/// Writes `n` in decimal, as `{}` would: each verdict's message has a number or two, and the
/// formatting machinery costs several times the digits.
pub(crate) fn push_number(out: &mut String, mut n: usize) -> std::fmt::Result {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        if let Some(d) = digits.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    for &d in digits.get(at..).unwrap_or_default() {
        out.push(char::from(d));
    }
    Ok(())
}

/// Appended to a message when failing shell commands do what the file tools do.
const FILE_TOOLS_HINT: &str =
    " Use the file tools (read, edit, write) instead of shell commands for file operations.";

/// A verdict's message: the step's template, else the action's default, rendered with `vars`.
/// `detail` is what a plugin found (a judge's analysis): after the step's wording, or, when the
/// step has none, worded for the action in place of the default. `file_tools_hint` appends the
/// hint to use the file tools.
pub(crate) fn verdict(
    step: Option<(usize, &Step)>,
    action: Action,
    vars: &Vars<'_>,
    detail: Option<&str>,
    file_tools_hint: bool,
) -> String {
    let detail = detail.map(str::trim).filter(|d| !d.is_empty());
    let mut message = match (step.and_then(|(_, s)| s.message.as_deref()), detail) {
        (Some(template), Some(d)) => format!("{} Details: {d}", render(template, vars)),
        (Some(template), None) => render(template, vars),
        (None, Some(d)) => finding(action, d),
        (None, None) => render(default_template(action), vars),
    };
    if file_tools_hint {
        message.push_str(FILE_TOOLS_HINT);
    }
    message
}

/// The warning given when a result shows a loop that the ladder refuses: the call already ran,
/// so the refusal waits for the next call of the same tool.
pub(crate) fn refusal_waits(
    tool: &str,
    detector: &str,
    count: u32,
    file_tools_hint: bool,
) -> String {
    format!(
        "{tool} keeps producing the same outcome ({detector}, {count} times). The next {tool} call will be refused unless you change your approach.{}",
        if file_tools_hint { FILE_TOOLS_HINT } else { "" }
    )
}

/// The refusal of a call when the group store fails closed and cannot be reached.
pub(crate) fn store_unreachable(tool: &str, group: &str) -> String {
    format!(
        "Refused: {tool} was not run. The shared loop-detection state of swarm `{group}` is unreachable and this deployment refuses calls it cannot check. Wait a moment and try again, or tell the user the swarm cannot proceed."
    )
}

/// The operator note about a plugin that panicked.
#[cfg_attr(not(feature = "plugins"), allow(dead_code))]
pub(crate) fn plugin_poisoned(name: &str, path: &std::path::Path) -> String {
    format!(
        "plugin `{name}` panicked and is disabled: it is skipped from now on ({})",
        path.display()
    )
}

/// The operator note about a plugin's first failure.
#[cfg_attr(not(feature = "plugins"), allow(dead_code))]
pub(crate) fn plugin_failed(name: &str, status: impl std::fmt::Display) -> String {
    format!(
        "plugin `{name}` failed with status {status}; its answer was ignored (later failures are only counted)"
    )
}

/// A plugin's own finding, worded for the action.
fn finding(action: Action, message: &str) -> String {
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

/// The template used when a ladder step has none.
fn default_template(action: Action) -> &'static str {
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
pub(crate) fn render(template: &str, v: &Vars<'_>) -> String {
    // Room for the values too (a pattern's words, a tool's name), so the message is allocated
    // once.
    let mut out = String::with_capacity(template.len() + 96);
    let mut rest = template;
    // Braces are ASCII: found as bytes, always on a character boundary.
    while let Some(i) = memchr::memchr2(b'{', b'}', rest.as_bytes()) {
        out.push_str(&rest[..i]);
        let r = &rest[i..];
        if r.starts_with("{{") || r.starts_with("}}") {
            out.push_str(&r[..1]);
            rest = &r[2..];
            continue;
        }
        if r.starts_with('{')
            && let Some(end) = r.find('}')
            && let Some((_, fill)) = FILLERS.iter().find(|(name, _)| *name == &r[1..end])
        {
            // Writing into a `String` cannot fail.
            let _ = fill(&mut out, v);
            rest = &r[end + 1..];
            continue;
        }
        out.push_str(&r[..1]);
        rest = &r[1..];
    }
    out.push_str(rest);
    out
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
            render(default_template(Action::Block), &vars()).get(..8),
            Some("Refused:")
        );
    }

    // Regression: `{workers}` was filled by the renderer but missing from the placeholders the
    // rule reference listed. Every declared placeholder is filled, and nothing else is.
    #[test]
    fn the_renderer_fills_exactly_the_declared_placeholders() {
        let declared: Vec<&str> = loopguard_rules::schema::PLACEHOLDERS
            .iter()
            .map(|p| p.name)
            .collect();
        let filled: Vec<&str> = FILLERS.iter().map(|(name, _)| *name).collect();
        assert_eq!(filled, declared);
        for name in declared {
            let template = format!("{{{name}}}");
            assert_ne!(
                render(&template, &vars()),
                template,
                "{template} is not filled"
            );
        }
    }

    #[test]
    fn numbers_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 4_096, u32::MAX as usize, usize::MAX] {
            let mut s = String::from("x");
            let _ = push_number(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
        assert_eq!(
            crate::escalation::rule_name("shell", "default", None),
            "categories.shell/ladders.default[0]"
        );
    }

    #[test]
    fn the_file_tools_hint_ends_the_message() {
        let step = Step {
            repeat: Some(1),
            flags: None,
            action: Action::Warn,
            message: Some("{tool} again.".into()),
        };
        let m = verdict(Some((0, &step)), Action::Warn, &vars(), None, true);
        assert_eq!(m, format!("bash again.{FILE_TOOLS_HINT}"));
        let m = refusal_waits("bash", "no_progress", 3, true);
        assert!(m.ends_with(FILE_TOOLS_HINT), "{m}");
        let m = verdict(
            Some((0, &step)),
            Action::Warn,
            &vars(),
            Some(" seen twice "),
            false,
        );
        assert_eq!(m, "bash again. Details: seen twice");
        let m = verdict(None, Action::Block, &vars(), Some("seen twice."), false);
        assert_eq!(
            m,
            "Refused: seen twice. The call was not run. Change your approach."
        );
    }
}
