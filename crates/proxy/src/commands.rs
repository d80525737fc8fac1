//! In-chat commands: `!/set(NAME=VALUE, …)` and `!/unset(NAME, …)` in user messages.
//!
//! They change the session's run-time settings tier ([`Settings`]) and are stripped from the
//! message before it is forwarded. Names are the in-chat names of [`SettingKey`]
//! (`tool-loop-detection`, `tool-loop-max-repeats`, `tool-loop-ttl`, `tool-loop-mode`); values
//! are checked by [`Settings::set`] against the policy's ladders.

use loopguard_rules::{SettingKey, Settings};

/// One parsed command (values not yet checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `!/set(NAME=VALUE, …)`.
    Set(Vec<(SettingKey, String)>),
    /// `!/unset(NAME, …)`.
    Unset(Vec<SettingKey>),
}

/// A user message's text with its commands taken out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The text left once every command is removed (trimmed at the seams).
    pub text: String,
    /// Whether anything command-like was found (valid or not).
    pub found: bool,
    /// The commands found, in order.
    pub commands: Vec<Command>,
    /// One line per problem, for the reply.
    pub errors: Vec<String>,
}

/// How the commands are written, for replies.
pub fn usage(ladders: &[&str]) -> String {
    format!(
        "!/set(tool-loop-detection=true|false), !/set(tool-loop-max-repeats=N), \
         !/set(tool-loop-ttl=SECONDS), !/set(tool-loop-mode={}), \
         !/unset(tool-loop-detection, tool-loop-max-repeats, tool-loop-ttl, tool-loop-mode)",
        ladders.join("|")
    )
}

/// Finds and removes every command in `text`.
pub fn scan(text: &str) -> Scan {
    let mut out = Scan::default();
    if !text.contains("!/") {
        out.text = text.to_owned();
        return out;
    }
    let mut kept = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("!/") {
        let after = &rest[at + 2..];
        let verb_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(after.len());
        let verb = &after[..verb_len];
        let open = after[verb_len..].starts_with('(');
        let known = verb == "set" || verb == "unset";
        if !open && !known {
            // Not a command (`!/usr/bin`, a bang-slash in prose): keep it as text.
            kept.push_str(&rest[..at + 2]);
            rest = after;
            continue;
        }
        out.found = true;
        let before = &rest[..at];
        let (args, consumed) = if open {
            let inner = &after[verb_len + 1..];
            match inner.find(')') {
                Some(close) => (Some(&inner[..close]), verb_len + 1 + close + 1),
                None => {
                    out.errors.push(format!("`!/{verb}(` has no closing `)`"));
                    (None, after.len())
                }
            }
        } else {
            out.errors.push(format!(
                "`!/{verb}` needs its arguments in parentheses, e.g. `!/{verb}(tool-loop-max-repeats{})`",
                if verb == "set" { "=5" } else { "" }
            ));
            (None, verb_len)
        };
        if let Some(args) = args {
            match verb {
                "set" => parse_set(args, &mut out),
                "unset" => parse_unset(args, &mut out),
                other => out.errors.push(format!(
                    "unknown command `!/{other}(…)`; the commands are `!/set(…)` and `!/unset(…)`"
                )),
            }
        }
        let tail = &after[consumed..];
        let sep = if before.ends_with(char::is_whitespace) || tail.starts_with(char::is_whitespace)
        {
            let gap = format!(
                "{}{}",
                &before[before.trim_end().len()..],
                &tail[..tail.len() - tail.trim_start().len()]
            );
            if gap.contains('\n') { "\n" } else { " " }
        } else {
            ""
        };
        kept.push_str(before.trim_end());
        if !kept.is_empty() && !tail.trim_start().is_empty() {
            kept.push_str(sep);
        }
        rest = tail.trim_start();
    }
    kept.push_str(rest);
    out.text = kept.trim().to_owned();
    out
}

fn key_of(name: &str, out: &mut Scan) -> Option<SettingKey> {
    if let Some(k) = SettingKey::from_chat_name(name) {
        return Some(k);
    }
    let mut msg = if name.is_empty() {
        "a setting name is missing".to_owned()
    } else {
        format!("unknown setting `{name}`")
    };
    let best = SettingKey::ALL
        .iter()
        .map(|k| (strsim::levenshtein(name, k.chat_name()), k.chat_name()))
        .min();
    match best {
        Some((d, suggestion)) if !name.is_empty() && d <= 3 => {
            msg.push_str(&format!("; did you mean `{suggestion}`?"));
        }
        _ => {
            let names: Vec<&str> = SettingKey::ALL.iter().map(|k| k.chat_name()).collect();
            msg.push_str(&format!("; the settings are {}", names.join(", ")));
        }
    }
    out.errors.push(msg);
    None
}

fn parse_set(args: &str, out: &mut Scan) {
    let mut pairs = Vec::new();
    let mut ok = true;
    for part in args.split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let Some((name, value)) = part.split_once('=') else {
            out.errors
                .push(format!("`{part}` needs a value: `!/set({part}=VALUE)`"));
            ok = false;
            continue;
        };
        match key_of(name.trim(), out) {
            Some(k) => pairs.push((k, value.trim().to_owned())),
            None => ok = false,
        }
    }
    if pairs.is_empty() && ok {
        out.errors
            .push("`!/set()` names no setting: write `!/set(NAME=VALUE)`".to_owned());
        return;
    }
    if ok {
        out.commands.push(Command::Set(pairs));
    }
}

fn parse_unset(args: &str, out: &mut Scan) {
    let mut keys = Vec::new();
    let mut ok = true;
    for name in args.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match key_of(name, out) {
            Some(k) => keys.push(k),
            None => ok = false,
        }
    }
    if keys.is_empty() && ok {
        out.errors
            .push("`!/unset()` names no setting: write `!/unset(NAME, …)`".to_owned());
        return;
    }
    if ok {
        out.commands.push(Command::Unset(keys));
    }
}

/// Applies commands to a copy of `settings`; every bad value is reported and then nothing
/// changes. Returns the new settings and a short description of what changed.
pub fn apply(
    commands: &[Command],
    settings: &Settings,
    ladders: &[&str],
) -> Result<(Settings, Vec<String>), Vec<String>> {
    let mut next = settings.clone();
    let mut changes = Vec::new();
    let mut errors = Vec::new();
    for c in commands {
        match c {
            Command::Set(pairs) => {
                for (k, v) in pairs {
                    match next.set(*k, v, ladders, k.chat_name()) {
                        Ok(()) => changes.push(format!("{}={}", k.chat_name(), v.trim())),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
            }
            Command::Unset(keys) => {
                for k in keys {
                    next.unset(*k);
                    changes.push(format!("{} unset", k.chat_name()));
                }
            }
        }
    }
    if errors.is_empty() {
        Ok((next, changes))
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LADDERS: &[&str] = &["break", "chance_then_break", "default"];

    #[test]
    fn a_pure_command_leaves_no_text() {
        let s = scan("!/set(tool-loop-max-repeats=5)");
        assert!(s.found);
        assert_eq!(s.text, "");
        assert_eq!(
            s.commands,
            vec![Command::Set(vec![(SettingKey::MaxRepeats, "5".into())])]
        );
        assert!(s.errors.is_empty());
    }

    #[test]
    fn commands_are_stripped_from_prose() {
        let s = scan("please !/set(tool-loop-mode=break, tool-loop-ttl=60) fix the build");
        assert_eq!(s.text, "please fix the build");
        assert_eq!(s.commands.len(), 1);
        let s = scan("!/unset(tool-loop-mode)\nnow run the tests");
        assert_eq!(s.text, "now run the tests");
        assert_eq!(s.commands, vec![Command::Unset(vec![SettingKey::Mode])]);
        let s = scan("first line\n!/set(tool-loop-detection=false)\nsecond line");
        assert_eq!(s.text, "first line\nsecond line");
    }

    #[test]
    fn text_without_commands_is_untouched() {
        let s = scan("run !/usr/bin/env and say hi!/");
        assert!(!s.found);
        assert_eq!(s.text, "run !/usr/bin/env and say hi!/");
        assert_eq!(scan("plain").text, "plain");
    }

    #[test]
    fn unknown_names_get_a_suggestion() {
        let s = scan("!/set(tool-loop-max-repeat=5)");
        assert!(s.commands.is_empty());
        assert_eq!(s.errors.len(), 1);
        assert!(
            s.errors[0].contains("did you mean `tool-loop-max-repeats`?"),
            "{}",
            s.errors[0]
        );
        let s = scan("!/unset(colour)");
        assert!(s.errors[0].contains("the settings are tool-loop-detection"));
    }

    #[test]
    fn malformed_commands_are_errors_not_text() {
        for text in [
            "!/set(tool-loop-max-repeats=5",
            "!/set(tool-loop-max-repeats)",
            "!/set()",
            "!/unset()",
            "!/set tool-loop-max-repeats=5",
            "!/reset(tool-loop-mode)",
        ] {
            let s = scan(text);
            assert!(s.found, "{text}");
            assert!(!s.errors.is_empty(), "{text}");
            assert!(s.commands.is_empty(), "{text}");
        }
    }

    #[test]
    fn apply_checks_values_and_changes_nothing_on_error() {
        let cmds = scan("!/set(tool-loop-max-repeats=1, tool-loop-mode=brake)").commands;
        let errors = apply(&cmds, &Settings::default(), LADDERS).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert!(errors[0].contains("expected a whole number from 2 to 1000"));
        assert!(errors[1].contains("expected one of break, chance_then_break"));
        let cmds = scan("!/set(tool-loop-max-repeats=7) !/set(tool-loop-mode=break)").commands;
        let (s, changes) = apply(&cmds, &Settings::default(), LADDERS).unwrap();
        assert_eq!(s.max_repeats, Some(7));
        assert_eq!(s.mode.as_deref(), Some("break"));
        assert_eq!(changes, ["tool-loop-max-repeats=7", "tool-loop-mode=break"]);
        let cmds = scan("!/unset(tool-loop-max-repeats)").commands;
        let (s, _) = apply(&cmds, &s, LADDERS).unwrap();
        assert_eq!(s.max_repeats, None);
        assert_eq!(s.mode.as_deref(), Some("break"));
    }

    #[test]
    fn no_input_panics() {
        for text in [
            "!/",
            "!/(",
            "!/set(",
            "!/set(=)",
            "!/unset(,,)",
            "é!/set(ü=ß)!/",
            "!/!/",
        ] {
            let _ = scan(text);
        }
    }
}
