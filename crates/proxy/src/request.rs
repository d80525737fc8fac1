//! Reading and rewriting a chat-completions request's `messages`.
//!
//! The client sends the whole conversation every time. What is new since the proxy last
//! answered is the **tail**: the messages after the last `assistant` message (tool results,
//! user messages). Only the tail is fed to the engine and only its commands are applied;
//! commands are stripped from every user message, so the model never sees one.

use serde_json::{Value, json};

use crate::commands::{self, Command};

/// What [`strip_commands`] found.
#[derive(Debug, Default)]
pub struct Stripped {
    /// Valid commands in tail messages, in order.
    pub commands: Vec<Command>,
    /// Problems with tail commands.
    pub errors: Vec<String>,
    /// The request's last message was a user message holding only commands: it asks the
    /// proxy, not the model, and gets the proxy's reply.
    pub reply_needed: bool,
    /// Per (rewritten) message: whether it is in the tail.
    pub in_tail: Vec<bool>,
}

/// Prefix of every text the proxy writes into a conversation.
pub const MARK: &str = "[loopguard]";

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or_default()
}

/// The text of message content: a string, or the text parts of an array, joined by newlines.
pub fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                _ => p.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Appends a note to message content (a string, an array of parts, or null).
pub fn append_text(content: &mut Value, note: &str) {
    match content {
        Value::String(s) if s.is_empty() => note.clone_into(s),
        Value::String(s) => {
            s.push_str("\n\n");
            s.push_str(note);
        }
        Value::Array(parts) => parts.push(json!({"type": "text", "text": note})),
        other => *other = Value::String(note.to_owned()),
    }
}

/// Strips commands from a user message's content; returns the scan of each text found and
/// whether anything but commands is left.
fn strip_content(content: &mut Value, scans: &mut Vec<commands::Scan>) -> bool {
    match content {
        Value::String(s) => {
            let scan = commands::scan(s);
            let left = !scan.text.is_empty() || !scan.found;
            if scan.found {
                s.clone_from(&scan.text);
                scans.push(scan);
            }
            left
        }
        Value::Array(parts) => {
            parts.retain_mut(|p| {
                let Some(Value::String(t)) = p.get_mut("text") else {
                    return true; // images, audio, files: kept as they are
                };
                let scan = commands::scan(t);
                if !scan.found {
                    return true;
                }
                t.clone_from(&scan.text);
                let keep = !scan.text.is_empty();
                scans.push(scan);
                keep
            });
            !parts.is_empty()
        }
        _ => true,
    }
}

/// Strips in-chat commands from every user message and collects the ones in the tail.
///
/// A user message left empty is dropped, and so is the proxy's reply to it (the assistant
/// message right after it, if it starts with [`MARK`] and has no tool calls): the model sees
/// neither the commands nor the proxy's answers to them.
///
/// Commands are read only from a person's own text: a user message right after tool results
/// is the host's (a framework's observation, pasted tool output, a "continue" prompt) and is
/// left as it is. Without `honour` (commands not allowed for this caller) nothing is read or
/// stripped: the text goes to the model as written.
pub fn strip_commands(messages: &mut Vec<Value>, honour: bool) -> Stripped {
    let tail_start = messages
        .iter()
        .rposition(|m| role(m) == "assistant")
        .map_or(0, |i| i + 1);
    let mut out = Stripped::default();
    if !honour {
        out.in_tail = (0..messages.len()).map(|i| i >= tail_start).collect();
        return out;
    }
    let mut kept = Vec::with_capacity(messages.len());
    let last = messages.len().saturating_sub(1);
    let mut drop_reply = false;
    let mut after_results = false;
    for (i, mut m) in std::mem::take(messages).into_iter().enumerate() {
        let tail = i >= tail_start;
        let hosts = after_results;
        after_results = matches!(role(&m), "tool" | "function");
        if drop_reply {
            drop_reply = false;
            let is_reply = role(&m) == "assistant"
                && m.get("tool_calls").is_none_or(Value::is_null)
                && text_of(m.get("content")).starts_with(MARK);
            if is_reply {
                continue;
            }
        }
        if role(&m) == "user"
            && !hosts
            && let Some(content) = m.get_mut("content")
        {
            let mut scans = Vec::new();
            let left = strip_content(content, &mut scans);
            if tail {
                for s in scans {
                    out.commands.extend(s.commands);
                    out.errors.extend(s.errors);
                }
            }
            if !left {
                drop_reply = true;
                if i == last {
                    out.reply_needed = true;
                }
                continue;
            }
        }
        out.in_tail.push(tail);
        kept.push(m);
    }
    *messages = kept;
    out
}

/// Where nudges go in the request to the model: the policy's `escalation.nudge`.
///
/// `Context` appends a nudge to the content of the tool result answering the call it is about
/// (the model reads it with the output); a nudge about no call (text loops) is appended to the
/// request's last message when that is a user or tool message, else it is a system note.
/// `System` adds a `system` message after the tool results it is about (or at the end); some
/// chat templates refuse system messages after the first one.
pub use loopguard_rules::Nudge as NudgePlacement;

/// Adds nudges to a request. `anchored` are (tool_call_id, text): every tool result with that
/// id gets the note, in this request and every later one, so the conversation the model sees
/// stays the same from turn to turn. `loose` notes about no call are added once.
pub fn apply_nudges(
    messages: &mut Vec<Value>,
    anchored: &[(String, String)],
    loose: &[String],
    placement: NudgePlacement,
) {
    let note_for = |m: &Value| -> Vec<&str> {
        if !matches!(role(m), "tool" | "function") {
            return Vec::new();
        }
        let Some(id) = m.get("tool_call_id").and_then(Value::as_str) else {
            return Vec::new();
        };
        anchored
            .iter()
            .filter(|(a, _)| a == id)
            .map(|(_, t)| t.as_str())
            .collect()
    };
    match placement {
        NudgePlacement::Context => {
            for m in messages.iter_mut() {
                let notes = note_for(m);
                if notes.is_empty() {
                    continue;
                }
                let note = notes.join("\n");
                match m.get_mut("content") {
                    Some(c) => append_text(c, &note),
                    None => {
                        if let Some(obj) = m.as_object_mut() {
                            obj.insert("content".into(), Value::String(note));
                        }
                    }
                }
            }
            if !loose.is_empty() {
                let note = loose.join("\n");
                match messages.last_mut() {
                    Some(m) if matches!(role(m), "user" | "tool") => {
                        if let Some(c) = m.get_mut("content") {
                            append_text(c, &note);
                        }
                    }
                    _ => messages.push(system_note(&note)),
                }
            }
        }
        NudgePlacement::System => {
            let mut out = Vec::with_capacity(messages.len() + 1);
            let mut pending: Vec<String> = Vec::new();
            for m in std::mem::take(messages) {
                let is_result = matches!(role(&m), "tool" | "function");
                if !is_result && !pending.is_empty() {
                    out.push(system_note(&pending.join("\n")));
                    pending.clear();
                }
                pending.extend(note_for(&m).into_iter().map(str::to_owned));
                out.push(m);
            }
            pending.extend(loose.iter().cloned());
            if !pending.is_empty() {
                out.push(system_note(&pending.join("\n")));
            }
            *messages = out;
        }
    }
}

fn system_note(text: &str) -> Value {
    json!({"role": "system", "content": text})
}

/// The tool name of a call id, from the assistant messages of a request.
pub fn tool_name_for<'a>(messages: &'a [Value], id: &str) -> Option<&'a str> {
    messages.iter().rev().find_map(|m| {
        m.get("tool_calls")?
            .as_array()?
            .iter()
            .find(|c| c.get("id").and_then(Value::as_str) == Some(id))?
            .get("function")?
            .get("name")?
            .as_str()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    #[test]
    fn only_tail_commands_count_and_all_are_stripped() {
        let mut m = msgs(json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "!/set(tool-loop-ttl=5) fix it"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "!/set(tool-loop-max-repeats=4)"}
        ]));
        let s = strip_commands(&mut m, true);
        assert!(s.reply_needed);
        assert_eq!(s.commands.len(), 1);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["content"], "fix it");
        assert_eq!(s.in_tail, [false, false, false]);
    }

    #[test]
    fn pure_commands_and_their_replies_leave_the_history() {
        let mut m = msgs(json!([
            {"role": "user", "content": "!/set(tool-loop-max-repeats=4)"},
            {"role": "assistant", "content": "[loopguard] Session settings changed"},
            {"role": "user", "content": [{"type": "text", "text": "build it"}]}
        ]));
        let s = strip_commands(&mut m, true);
        assert!(!s.reply_needed);
        assert!(s.commands.is_empty(), "not in the tail");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0]["content"][0]["text"], "build it");
        assert_eq!(s.in_tail, [true]);
    }

    #[test]
    fn command_parts_are_removed_from_arrays() {
        let mut m = msgs(json!([
            {"role": "user", "content": [
                {"type": "text", "text": "!/unset(tool-loop-mode)"},
                {"type": "image_url", "image_url": {"url": "data:"}}
            ]}
        ]));
        let s = strip_commands(&mut m, true);
        assert!(!s.reply_needed, "the image is still for the model");
        assert_eq!(m[0]["content"].as_array().unwrap().len(), 1);
        assert_eq!(s.commands.len(), 1);
    }

    #[test]
    fn context_nudges_follow_their_result_every_time() {
        let base = msgs(json!([
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "bash"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
            {"role": "user", "content": [{"type": "text", "text": "go"}]}
        ]));
        let anchored = vec![("c1".to_owned(), "[loopguard] stop".to_owned())];
        let mut m = base.clone();
        apply_nudges(
            &mut m,
            &anchored,
            &["[loopguard] text".to_owned()],
            NudgePlacement::Context,
        );
        assert_eq!(m[1]["content"], "out\n\n[loopguard] stop");
        assert_eq!(m[2]["content"][1]["text"], "[loopguard] text");
        let mut m = base;
        apply_nudges(&mut m, &anchored, &[], NudgePlacement::System);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[2],
            json!({"role": "system", "content": "[loopguard] stop"})
        );
        assert_eq!(tool_name_for(&m, "c1"), Some("bash"));
    }

    #[test]
    fn loose_nudges_after_an_assistant_message_are_system_notes() {
        let mut m = msgs(json!([{"role": "assistant", "content": "hi"}]));
        apply_nudges(&mut m, &[], &["n".to_owned()], NudgePlacement::Context);
        assert_eq!(m[1]["role"], "system");
    }

    #[test]
    fn append_text_handles_every_shape() {
        let mut v = Value::Null;
        append_text(&mut v, "n");
        assert_eq!(v, "n");
        let mut v = json!("");
        append_text(&mut v, "n");
        assert_eq!(v, "n");
        let mut v = json!([]);
        append_text(&mut v, "n");
        assert_eq!(v, json!([{"type": "text", "text": "n"}]));
    }
}
