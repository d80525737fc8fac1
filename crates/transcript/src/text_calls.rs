//! Tool calls written in an assistant's text, as agents without native tool calling write
//! them, and the observations that answer them.
//!
//! Forms read (each in one linear pass, bounded by the text):
//!
//! - **ReAct** (LangChain agents and their kin): an `Action: <tool>` line and an
//!   `Action Input: <input>` after it, or `Action:` with a fenced JSON blob
//!   `{"action": <tool>, "action_input": <input>}`; `Final Answer` is no call.
//! - **XML tool use** (Cline, Roo Code, Kilo Code): the message ends with
//!   `<tool_name><param>value</param>…</tool_name>`, a snake_case name with an underscore;
//!   `<tool_call>{"name": …, "arguments": …}</tool_call>` (Hermes, Qwen) names its tool inside.
//! - **Function tags** (OpenHands' prompted function calling, Qwen3-Coder): the message ends
//!   with `<function=name><parameter=key>value</parameter>…</function>`, maybe inside
//!   `<tool_call>…</tool_call>`; the closing `</function>` may be missing (it is a stop word).
//! - **Code actions** (smolagents' CodeAgent): a fenced block followed by `<end_code>`, a
//!   `Code:` line followed by a fenced block, or `<code>…</code>` ending the message: a call of
//!   `python` with the code.
//! - **JSON actions**: a message that is one JSON object (bare or as its one fenced block)
//!   naming an action. Terminus (Terminal-Bench's agent) sends keystrokes to a terminal,
//!   `{"analysis", "plan", "commands": [{"keystrokes", "duration"}], "task_complete"}`, prose
//!   around the object allowed as its parser allows it: a call of `terminal` with the
//!   keystrokes as command lines, or of `wait` when it types nothing (it waits, then reads the screen), and no call
//!   when it only declares the task complete. AutoGPT's `{"thoughts", "command": {"name",
//!   "args"}}`, LangChain's JSON agents' `{"action", "action_input"}`, and a tool call written
//!   out as text instead of made (`{"name", "arguments"}`, `{"name", "parameters"}`).
//! - **Shell actions** (SWE-agent, mini-swe-agent and other thought-action agents): the
//!   message ends with a fenced shell block (`bash`, `sh`, `shell`, `console`, or
//!   mini-swe-agent's `mswea_bash_command`), or with a Python block for a code executor
//!   (AutoGen's, answering `exitcode: 0 (execution succeeded)`). Prose ends with code often
//!   enough that this form counts as a call only when the next message is an observation
//!   ([`is_observation`]).
//!
//! The next user message after a call read from text is its result: such frameworks send the
//! observation as a user message.

use serde_json::{Map, Value, json};

/// A call read from an assistant's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TextCall {
    pub tool: String,
    pub arguments: Value,
    /// The form says plainly that it is a call; `false` for a shell block, which is a call
    /// only when an observation answers it.
    pub sure: bool,
    /// Where the call starts in the text given to [`text_call`]: what comes before it is the
    /// message's prose. The whole text for a fenced block (its code is no prose the text
    /// detectors read).
    pub prose: usize,
}

/// Longest tool name read from text.
const MAX_NAME: usize = 64;
/// Most words of a tool name written in words, followed by its `Action Input`.
const MAX_NAME_WORDS: usize = 8;
/// Most tags an XML tool use is searched for parameters.
const MAX_PARAMS: usize = 64;

/// The call an assistant's text makes, if it makes one.
pub(crate) fn text_call(text: &str) -> Option<TextCall> {
    let lead = text.len() - text.trim_start().len();
    let whole = text.len();
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut call = json_call(text)
        .or_else(|| function_call(text))
        .or_else(|| xml_call(text))
        .or_else(|| react_call(text))
        .or_else(|| code_call(text))
        .or_else(|| shell_call(text))?;
    call.prose = if call.prose >= text.len() {
        whole
    } else {
        lead + call.prose
    };
    Some(call)
}

/// The byte offset of `part`, a subslice of `text`, in `text`.
fn offset(text: &str, part: &str) -> usize {
    (part.as_ptr() as usize).saturating_sub(text.as_ptr() as usize)
}

/// Whether a user message is a framework's observation of what a call did.
pub(crate) fn is_observation(text: &str) -> bool {
    let t = text.trim();
    let head: String = t.chars().take(16).collect::<String>().to_ascii_lowercase();
    head.starts_with("observation")
        || head.starts_with("execution logs")
        // mini-swe-agent: `<returncode>0</returncode>` then `<output>…</output>`.
        || head.starts_with("<returncode>")
        // AutoGen's code executor: `exitcode: 1 (execution failed)` then `Code output: …`.
        || head.starts_with("exitcode:")
        || t.starts_with("EXECUTION RESULT of [")
        || t.ends_with("bash-$")
        || t.contains("(Current directory:")
}

/// A tool's name as agents write it: letters, digits, `_`, `-` and `.`, at most
/// [`MAX_NAME`] bytes.
fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

// --- JSON actions ------------------------------------------------------------------------

/// Longest text read as a JSON action.
const MAX_JSON_ACTION: usize = 256 << 10;

/// A message that is a JSON object naming an action.
fn json_call(text: &str) -> Option<TextCall> {
    if text.len() > MAX_JSON_ACTION || !text.contains('{') {
        return None;
    }
    let whole = text
        .strip_prefix("```")
        .and_then(|t| t.strip_suffix("```"))
        .and_then(|t| {
            let (lang, body) = t.split_once('\n')?;
            let lang = lang.trim();
            (matches!(lang, "" | "json") && !body.contains("```")).then_some(body.trim())
        })
        .unwrap_or(text);
    // The object's strings (a heredoc's lines, a plan) are no prose the text detectors read:
    // what comes before the object is.
    if whole.starts_with('{') && whole.ends_with('}') {
        let v: Value = serde_json::from_str(whole).ok()?;
        let mut call = terminus_call(&v).or_else(|| named_call(&v))?;
        call.prose = 0;
        return Some(call);
    }
    // Terminus reads the object out of the text around it (and warns about the text).
    let (open, close) = (text.find('{')?, text.rfind('}')?);
    let v: Value = serde_json::from_str(text.get(open..=close)?).ok()?;
    let mut call = terminus_call(&v)?;
    call.prose = open;
    Some(call)
}

/// Terminus' batch of keystrokes (`commands`, each with `keystrokes`).
fn terminus_call(v: &Value) -> Option<TextCall> {
    let commands = v.get("commands")?.as_array()?;
    // The keystrokes as the command lines they type: a key sent alone (`C-c`) is a line of
    // its own, so that a shell command's words are read as the shell tools' are.
    let mut typed = String::new();
    for c in commands {
        let keys = c.get("keystrokes")?.as_str()?;
        if keys.is_empty() {
            continue;
        }
        if !typed.is_empty() && !typed.ends_with('\n') {
            typed.push('\n');
        }
        typed.push_str(keys);
    }
    let complete = ["task_complete", "is_task_complete"]
        .iter()
        .any(|k| v.get(*k).and_then(Value::as_bool) == Some(true));
    let typed = typed.trim_end_matches('\n');
    let (tool, arguments) = match (!typed.is_empty(), complete) {
        (true, _) => ("terminal", json!({ "command": typed })),
        // Only the task declared done: an answer, no call.
        (false, true) => return None,
        // Nothing typed: a wait, then a look at the screen.
        (false, false) => ("wait", json!({})),
    };
    Some(TextCall {
        tool: tool.to_owned(),
        arguments,
        sure: true,
        prose: usize::MAX,
    })
}

/// An object naming a tool and its input: AutoGPT's `command`, a JSON agent's `action`, or a
/// tool call written out (`name` with `arguments` or `parameters`, and nothing else).
fn named_call(v: &Value) -> Option<TextCall> {
    let obj = v.as_object()?;
    let (tool, input) = if let Some(c) = obj.get("command").filter(|c| c.is_object()) {
        (c.get("name")?.as_str()?, c.get("args").cloned())
    } else if let (Some(a), Some(input)) = (obj.get("action"), obj.get("action_input")) {
        let tool = a.as_str()?;
        if is_final(tool) {
            return None;
        }
        (tool, Some(input.clone()))
    } else {
        let extra = obj.keys().any(|k| {
            !matches!(
                k.as_str(),
                "name" | "arguments" | "parameters" | "id" | "type"
            )
        });
        let input = obj.get("arguments").or_else(|| obj.get("parameters"))?;
        // `parameters` with `properties` is a tool's schema, not a call of it.
        if extra || input.get("properties").is_some() {
            return None;
        }
        (obj.get("name")?.as_str()?, Some(input.clone()))
    };
    if !is_tool_name(tool) {
        return None;
    }
    let arguments = match input {
        Some(Value::String(s)) => serde_json::from_str::<Value>(&s)
            .ok()
            .filter(Value::is_object)
            .unwrap_or(Value::String(s)),
        Some(other) => other,
        None => Value::Null,
    };
    Some(TextCall {
        tool: tool.to_owned(),
        arguments: input_arguments(arguments),
        sure: true,
        prose: usize::MAX,
    })
}

/// What an observation says once the label some frameworks put on every one is taken off
/// (Terminus' `New Terminal Output:`): with nothing after it, nothing new was seen.
pub(crate) fn observation_body(text: &str) -> &str {
    let t = text.trim_start();
    ["New Terminal Output:", "Current Terminal Screen:"]
        .iter()
        .find_map(|label| t.strip_prefix(label))
        .map_or(text, |rest| {
            rest.trim_start_matches([' ', '\t', '\r', '\n'])
        })
}

// --- function tags -------------------------------------------------------------------------

/// `<function=name><parameter=key>value</parameter>…</function>` ending the message.
fn function_call(text: &str) -> Option<TextCall> {
    let t = text.trim_end();
    let t = t.strip_suffix("</tool_call>").map_or(t, str::trim_end);
    let open = t.rfind("<function=")?;
    // The opening tag starts a line.
    let before = t[..open].trim_end_matches([' ', '\t']);
    if !(before.is_empty() || before.ends_with('\n') || before.ends_with("<tool_call>")) {
        return None;
    }
    let after = &t[open + "<function=".len()..];
    let gt = after.find('>')?;
    let name = after[..gt].trim();
    if !is_tool_name(name) {
        return None;
    }
    let body = &after[gt + 1..];
    let body = match body.strip_suffix("</function>") {
        Some(b) => b,
        // Cut at the stop word: the call ends with its last parameter, or has none.
        None if body.trim_end().ends_with("</parameter>") || body.trim().is_empty() => body,
        None => return None,
    };
    let mut args = Map::new();
    let mut rest = body;
    for _ in 0..MAX_PARAMS {
        let Some(at) = rest.find("<parameter=") else {
            break;
        };
        let p = &rest[at + "<parameter=".len()..];
        let Some(gt) = p.find('>') else { break };
        let key = p[..gt].trim();
        let value = &p[gt + 1..];
        let Some(end) = value.find("</parameter>") else {
            break;
        };
        if !key.is_empty() && key.len() <= MAX_NAME {
            // One newline around a value is the form's own.
            let v = value[..end].strip_prefix('\n').unwrap_or(&value[..end]);
            let v = v.strip_suffix('\n').unwrap_or(v);
            args.insert(key.to_owned(), Value::String(v.to_owned()));
        }
        rest = &value[end + "</parameter>".len()..];
    }
    let before = before.strip_suffix("<tool_call>").unwrap_or(before);
    Some(TextCall {
        tool: name.to_owned(),
        arguments: Value::Object(args),
        sure: true,
        prose: before.len(),
    })
}

// --- XML tool use ------------------------------------------------------------------------

fn is_snake_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.contains('_')
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn xml_call(text: &str) -> Option<TextCall> {
    let close_at = text.rfind("</")?;
    let name = text[close_at + 2..].strip_suffix('>')?;
    if !is_snake_name(name) {
        return None;
    }
    let open = format!("<{name}>");
    let start = text[..close_at].find(&open)?;
    // The opening tag starts a line.
    let before = text[..start].trim_end_matches([' ', '\t']);
    if !(before.is_empty() || before.ends_with('\n')) {
        return None;
    }
    let inner = &text[start + open.len()..close_at];
    if matches!(name, "tool_call" | "function_call") {
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        let tool = v.get("name").and_then(Value::as_str)?;
        if tool.is_empty() || tool.len() > MAX_NAME {
            return None;
        }
        let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
            Some(Value::String(s)) => {
                serde_json::from_str(s).unwrap_or_else(|_| json!({ "input": s }))
            }
            Some(a) => a.clone(),
            None => json!({}),
        };
        return Some(TextCall {
            tool: tool.to_owned(),
            arguments,
            sure: true,
            prose: start,
        });
    }
    Some(TextCall {
        tool: name.to_owned(),
        arguments: xml_children(inner),
        sure: true,
        prose: start,
    })
}

/// The top-level `<k>v</k>` elements of a tool use, as an object (values trimmed, nested
/// markup kept as text); `{"input": …}` for text without elements.
fn xml_children(inner: &str) -> Value {
    let mut out = Map::new();
    let mut rest = inner;
    // Each tag tried searches the rest for its end: a bounded number of tries keeps a text
    // of many unclosed tags linear.
    let mut tries = 0;
    while let Some(lt) = rest.find('<') {
        tries += 1;
        if tries > MAX_PARAMS {
            break;
        }
        let after = &rest[lt + 1..];
        let Some(gt) = after.find('>') else { break };
        let key = &after[..gt];
        let valid = !key.is_empty()
            && key.len() <= MAX_NAME
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            rest = after;
            continue;
        }
        let body = &after[gt + 1..];
        let close = format!("</{key}>");
        let Some(end) = body.find(&close) else {
            rest = after;
            continue;
        };
        out.insert(key.to_owned(), Value::String(body[..end].trim().to_owned()));
        rest = &body[end + close.len()..];
    }
    if out.is_empty() {
        json!({ "input": inner.trim() })
    } else {
        Value::Object(out)
    }
}

// --- ReAct ---------------------------------------------------------------------------------

/// The text after `label:` when `line` (trimmed, bold markers dropped) starts with it.
fn labelled<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let l = line.trim().trim_start_matches("**");
    let rest = l.get(..label.len())?;
    if !rest.eq_ignore_ascii_case(label) {
        return None;
    }
    let rest = l[label.len()..].trim_start_matches("**").trim_start();
    Some(rest.strip_prefix(':')?.trim_start_matches("**").trim())
}

fn react_call(text: &str) -> Option<TextCall> {
    let lines: Vec<&str> = text.lines().collect();
    if lines.iter().any(|l| labelled(l, "Final Answer").is_some()) {
        return None;
    }
    // The first action is the one run: a model that writes on past it (an observation it
    // imagines, a next action) is cut there by the framework.
    let at = lines.iter().position(|l| labelled(l, "Action").is_some())?;
    let named = labelled(lines[at], "Action")?
        .trim_matches(|c: char| matches!(c, '`' | '"' | '\'' | '*'))
        .trim();
    let rest = &lines[at + 1..];
    if named.is_empty() {
        // `Action:` and a JSON blob naming the tool.
        let joined = rest.join("\n");
        let blob = fenced_body(&joined)?;
        let v: Value = serde_json::from_str(blob.trim()).ok()?;
        let tool = v.get("action").and_then(Value::as_str)?;
        if is_final(tool) || tool.len() > MAX_NAME {
            return None;
        }
        return Some(TextCall {
            tool: tool.to_owned(),
            arguments: input_arguments(v.get("action_input").cloned().unwrap_or(Value::Null)),
            sure: true,
            prose: offset(text, lines[at]),
        });
    }
    if is_final(named) || named.len() > MAX_NAME {
        return None;
    }
    // A tool may be named in words (CrewAI's `Search the internet with Serper`); an action
    // line of more words is a sentence, not a name.
    let words = named.split_whitespace().count();
    let Some(k) = rest
        .iter()
        .position(|l| labelled(l, "Action Input").is_some())
    else {
        // A tool named on the message's last line and nothing after it: the model stopped
        // where its input belongs. The framework rejects the action, but it was attempted, and
        // the same attempt rejected the same way again and again is a loop like any other.
        let last = rest.iter().all(|l| l.trim().is_empty());
        return (last && is_tool_name(named)).then(|| TextCall {
            tool: named.to_owned(),
            arguments: json!({}),
            sure: true,
            prose: offset(text, lines[at]),
        });
    };
    if words > MAX_NAME_WORDS {
        return None;
    }
    let mut input = vec![labelled(rest[k], "Action Input")?];
    input.extend(
        rest[k + 1..]
            .iter()
            .take_while(|l| labelled(l, "Observation").is_none())
            .copied(),
    );
    let input = input.join("\n");
    let input = fenced_body(&input).unwrap_or(&input).trim();
    let value = serde_json::from_str::<Value>(input)
        .ok()
        .unwrap_or_else(|| Value::String(input.trim_matches('"').to_owned()));
    Some(TextCall {
        tool: named.to_owned(),
        arguments: input_arguments(value),
        sure: true,
        prose: offset(text, lines[at]),
    })
}

fn is_final(tool: &str) -> bool {
    tool.eq_ignore_ascii_case("final answer") || tool.eq_ignore_ascii_case("none")
}

/// A ReAct input as arguments: an object as it is, anything else as `{"input": …}`.
fn input_arguments(v: Value) -> Value {
    match v {
        Value::Object(_) => v,
        Value::Null => json!({}),
        other => json!({ "input": other }),
    }
}

/// The body of the first fenced block in `text`.
fn fenced_body(text: &str) -> Option<&str> {
    let open = text.find("```")?;
    let after = &text[open + 3..];
    let body_start = after.find('\n')? + 1;
    let body = &after[body_start..];
    let end = body.find("```")?;
    Some(&body[..end])
}

// --- code and shell actions ----------------------------------------------------------------

/// The last fenced block of `text` when the text ends with it (`end` allows a suffix such as
/// `<end_code>` after the fence): its language tag and body.
fn last_fence<'a>(text: &'a str, end: &str) -> Option<(&'a str, &'a str)> {
    let t = text.trim_end().strip_suffix(end)?.trim_end();
    let t = t.strip_suffix("```")?;
    let open = t.rfind("```")?;
    let after = &t[open + 3..];
    let nl = after.find('\n')?;
    let lang = after[..nl].trim();
    if lang.contains(char::is_whitespace) {
        return None;
    }
    Some((lang, after[nl + 1..].trim_end_matches('\n')))
}

fn code_call(text: &str) -> Option<TextCall> {
    let code = |body: &str| {
        let body = body.trim();
        (!body.is_empty()).then(|| TextCall {
            tool: "python".to_owned(),
            arguments: json!({ "code": body }),
            sure: true,
            prose: usize::MAX,
        })
    };
    if let Some((lang, body)) = last_fence(text, "<end_code>")
        && matches!(lang, "" | "py" | "python")
    {
        return code(body);
    }
    if let Some(t) = text.trim_end().strip_suffix("</code>")
        && let Some(open) = t.rfind("<code>")
        && text.lines().any(|l| labelled(l, "Thought").is_some())
    {
        return code(&t[open + "<code>".len()..]);
    }
    let (lang, body) = last_fence(text, "")?;
    let before = &text[..text.rfind(body)?];
    let code_label = before
        .lines()
        .rev()
        .nth(1)
        .is_some_and(|l| labelled(l, "Code").is_some_and(str::is_empty));
    if code_label && matches!(lang, "" | "py" | "python") {
        return code(body);
    }
    None
}

fn shell_call(text: &str) -> Option<TextCall> {
    let (lang, body) = last_fence(text, "")?;
    let command = body.trim();
    if command.is_empty() || command.len() > 16 << 10 {
        return None;
    }
    match lang {
        "" | "bash" | "sh" | "shell" | "console" | "mswea_bash_command" => Some(TextCall {
            tool: "bash".to_owned(),
            arguments: json!({ "command": command }),
            sure: false,
            prose: usize::MAX,
        }),
        // A code executor's (AutoGen's) Python block.
        "python" | "py" | "python3" => Some(TextCall {
            tool: "python".to_owned(),
            arguments: json!({ "code": command }),
            sure: false,
            prose: usize::MAX,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn call(text: &str) -> Option<(String, Value, bool)> {
        text_call(text).map(|c| (c.tool, c.arguments, c.sure))
    }

    #[test]
    fn react_actions_are_calls_and_final_answers_are_not() {
        assert_eq!(
            call(
                "Thought: I should look it up.\nAction: search\nAction Input: rust borrow checker"
            ),
            Some((
                "search".into(),
                json!({"input": "rust borrow checker"}),
                true
            ))
        );
        assert_eq!(
            call("Thought: read it\nAction: `read_file`\nAction Input: {\"path\": \"a.rs\"}\n"),
            Some(("read_file".into(), json!({"path": "a.rs"}), true))
        );
        assert_eq!(
            call(
                "Thought: x\nAction:\n```json\n{\"action\": \"search\", \"action_input\": \"q\"}\n```"
            ),
            Some(("search".into(), json!({"input": "q"}), true))
        );
        assert_eq!(
            call("Thought: done\nFinal Answer: 42"),
            None,
            "an answer is no call"
        );
        assert_eq!(
            call("Action:\n```json\n{\"action\": \"Final Answer\", \"action_input\": \"42\"}\n```"),
            None
        );
        // A tool named last, with no input: an attempt the framework will reject, a call still.
        assert_eq!(
            call("I will read it.\nAction: read_fixed_file\n"),
            Some(("read_fixed_file".into(), json!({}), true))
        );
        // A tool named in words (CrewAI's), its input after it.
        assert_eq!(
            call(
                "Thought: search it\nAction: Search the internet with Serper\nAction Input: {\"search_query\": \"uv\"}"
            ),
            Some((
                "Search the internet with Serper".into(),
                json!({"search_query": "uv"}),
                true
            ))
        );
        assert_eq!(
            call(
                "Action: I will first look at the logs and then decide which of the files to change\nAction Input: x"
            ),
            None,
            "a sentence is no tool name"
        );
        assert_eq!(call("Action: search the web"), None, "no tool name");
        assert_eq!(
            call("Action: search\nThen I will summarize."),
            None,
            "words after it: no attempt"
        );
        // A model writing on past its action (an imagined observation, a next action): the
        // framework runs the first.
        assert_eq!(
            call(
                "Action: search\nAction Input: first\nObservation: made up\nThought: next\nAction: lookup\nAction Input: second"
            ),
            Some(("search".into(), json!({"input": "first"}), true))
        );
    }

    #[test]
    fn xml_tool_use_ending_the_message_is_a_call() {
        assert_eq!(
            call(
                "<thinking>Look at it.</thinking>\n<read_file>\n<path>src/main.rs</path>\n</read_file>"
            ),
            Some(("read_file".into(), json!({"path": "src/main.rs"}), true))
        );
        assert_eq!(
            call(
                "I will run it.\n\n<execute_command>\n<command>cargo test</command>\n<requires_approval>false</requires_approval>\n</execute_command>"
            ),
            Some((
                "execute_command".into(),
                json!({"command": "cargo test", "requires_approval": "false"}),
                true
            ))
        );
        assert_eq!(
            call(
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
            ),
            Some(("get_weather".into(), json!({"city": "Oslo"}), true))
        );
        // Markup inside prose, or a tag that is no tool's name, is no call.
        assert_eq!(call("Use <b>bold</b>"), None);
        assert_eq!(call("The tag is <read_file>x</read_file> inline"), None);
        assert_eq!(call("<thinking>hmm</thinking>"), None);
    }

    #[test]
    fn code_actions_are_python_calls() {
        assert_eq!(
            call("Thought: search\nCode:\n```py\nprint(web_search(\"x\"))\n```<end_code>"),
            Some((
                "python".into(),
                json!({"code": "print(web_search(\"x\"))"}),
                true
            ))
        );
        assert_eq!(
            call("Thought: search\n<code>\nprint(1)\n</code>"),
            Some(("python".into(), json!({"code": "print(1)"}), true))
        );
        assert_eq!(
            call("Thought: search\nCode:\n```python\nx = 1\n```"),
            Some(("python".into(), json!({"code": "x = 1"}), true))
        );
    }

    #[test]
    fn a_closing_shell_block_is_a_call_only_if_observed() {
        assert_eq!(
            call("Let me list the files.\n\n```\nls -la\n```"),
            Some(("bash".into(), json!({"command": "ls -la"}), false))
        );
        assert_eq!(
            call("Here is an example:\n```rust\nfn main() {}\n```"),
            None
        );
        assert_eq!(call("```\nls\n``` and then more prose"), None);
        assert!(is_observation("OBSERVATION:\nfile.txt"));
        assert!(is_observation(
            "file.txt\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"
        ));
        assert!(is_observation("Observation: 3 results"));
        assert!(!is_observation("Thanks! Now do the other thing."));
    }

    /// AutoGen's user proxy runs the code block a reply ends with and answers `exitcode: …`:
    /// such blocks were no calls and the executor's answers no observations.
    #[test]
    fn a_code_executors_blocks_and_answers_are_calls_and_results() {
        assert_eq!(
            call("Let me load it.\n\n```python\nimport pandas as pd\nprint(1)\n```"),
            Some((
                "python".into(),
                json!({"code": "import pandas as pd\nprint(1)"}),
                false
            ))
        );
        assert!(is_observation(
            "exitcode: 1 (execution failed)\nCode output: \nunknown language yaml\n"
        ));
        assert!(is_observation(
            "exitcode: 0 (execution succeeded)\nCode output: \n37\n"
        ));
        assert_eq!(
            call("Here is the config:\n```yaml\nkind: Service\n```"),
            None
        );
    }

    #[test]
    fn function_tags_are_calls_with_or_without_their_closing_tag() {
        // OpenHands' prompted function calling: the closing tag is its stop word.
        assert_eq!(
            call(
                "I'll look at the tests.\n\n<function=execute_bash>\n<parameter=command>\nls tests/\n</parameter>\n</function>"
            ),
            Some(("execute_bash".into(), json!({"command": "ls tests/"}), true))
        );
        assert_eq!(
            call(
                "<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/repo/a.py</parameter>"
            ),
            Some((
                "str_replace_editor".into(),
                json!({"command": "view", "path": "/repo/a.py"}),
                true
            ))
        );
        // Qwen3-Coder wraps it in a tool_call tag.
        assert_eq!(
            call(
                "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/lib.rs\n</parameter>\n</function>\n</tool_call>"
            ),
            Some(("read_file".into(), json!({"path": "src/lib.rs"}), true))
        );
        assert_eq!(
            call("<function=finish>\n</function>"),
            Some(("finish".into(), json!({}), true))
        );
        // Mentioned in prose, or followed by more prose: no call.
        assert_eq!(call("Use <function=x> tags to call tools."), None);
        assert_eq!(
            call(
                "<function=execute_bash>\n<parameter=command>ls</parameter>\n</function>\nThen I will read it."
            ),
            None
        );
    }

    #[test]
    fn mini_swe_agent_actions_are_observed_by_their_return_code() {
        assert_eq!(
            call("THOUGHT: Let me see the file.\n\n```mswea_bash_command\ncat a.py\n```"),
            Some(("bash".into(), json!({"command": "cat a.py"}), false))
        );
        assert!(is_observation(
            "<returncode>0</returncode>\n<output>\nx = 1\n</output>"
        ));
        assert!(is_observation(
            "EXECUTION RESULT of [execute_bash]:\nfile.txt"
        ));
    }

    #[test]
    fn json_actions_are_calls() {
        // Terminus: keystrokes are a terminal call; none typed is a wait; done alone is no call.
        let terminus = |commands: &str, done: bool| {
            format!(
                "{{\n  \"analysis\": \"The build failed.\",\n  \"plan\": \"Look at the log.\",\n  \"commands\": {commands},\n  \"task_complete\": {done}\n}}"
            )
        };
        assert_eq!(
            call(&terminus(
                r#"[{"keystrokes": "C-c", "duration": 0.5}, {"keystrokes": "tail -n 20 build.log\n", "duration": 1}]"#,
                false
            )),
            Some((
                "terminal".into(),
                json!({"command": "C-c\ntail -n 20 build.log"}),
                true
            ))
        );
        assert_eq!(
            call(&terminus(r#"[{"keystrokes": "", "duration": 30}]"#, false)),
            Some(("wait".into(), json!({}), true))
        );
        assert_eq!(
            call(&terminus("[]", false)),
            Some(("wait".into(), json!({}), true))
        );
        assert_eq!(call(&terminus("[]", true)), None, "only done");
        // Text before the object, as Terminus' parser allows (with a warning).
        let with_prose = format!(
            "Let me check.\n{}",
            terminus(r#"[{"keystrokes": "ls\n", "duration": 0.1}]"#, false)
        );
        let c = text_call(&with_prose).unwrap();
        assert_eq!(
            (c.tool.as_str(), c.prose),
            ("terminal", "Let me check.\n".len())
        );
        // AutoGPT, a JSON agent's action, a call written out as text.
        assert_eq!(
            call(
                r#"{"thoughts": {"text": "search", "plan": "- find"}, "command": {"name": "google", "args": {"query": "rust 2024"}}}"#
            ),
            Some(("google".into(), json!({"query": "rust 2024"}), true))
        );
        assert_eq!(
            call("```json\n{\"action\": \"search\", \"action_input\": \"borrow checker\"}\n```"),
            Some(("search".into(), json!({"input": "borrow checker"}), true))
        );
        assert_eq!(
            call(r#"{"action": "Final Answer", "action_input": "42"}"#),
            None
        );
        assert_eq!(
            call(r#"{"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}"#),
            Some(("get_weather".into(), json!({"city": "Oslo"}), true))
        );
        assert_eq!(
            call(r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#),
            Some(("get_weather".into(), json!({"city": "Oslo"}), true))
        );
        // Answers that are JSON, and schemas, are no calls.
        for answer in [
            r#"{"name": "Ada", "age": 36}"#,
            r#"{"action": "approve", "reason": "fine"}"#,
            r#"{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}"#,
            r#"{"name": "x", "arguments": {}, "note": "y"}"#,
            "The result is {\"commands\": [{\"keystrokes\": 3}]}",
        ] {
            assert_eq!(call(answer), None, "{answer}");
        }
    }

    #[test]
    fn terminal_output_labels_are_taken_off_observations() {
        assert_eq!(
            observation_body("New Terminal Output:\n\n$ ls\na b\n"),
            "$ ls\na b\n"
        );
        assert_eq!(observation_body("New Terminal Output:\n\n"), "");
        assert_eq!(observation_body("Current Terminal Screen:\n$ "), "$ ");
        assert_eq!(observation_body("Observation: x"), "Observation: x");
    }

    #[test]
    fn odd_text_never_panics() {
        for t in [
            "<function=",
            "<function=>",
            "<function=a><parameter=",
            "<function=a><parameter=b>",
            "<function=a></parameter>",
            "</",
            "</a_b>",
            "<a_b></a_b>",
            "Action:",
            "Action: x\nAction Input:",
            "```",
            "``````",
            "```\n```",
            "<code></code>",
            "Code:\n```",
            "é</a_b>",
            "<tool_call>{}</tool_call>",
            "**Action**: x\n**Action Input**: y",
            &format!("<run_it>\n{}</run_it>", "<a>".repeat(100_000)),
        ] {
            let _ = text_call(t);
            let _ = is_observation(t);
        }
    }
}
