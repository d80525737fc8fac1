//! Codex CLI session rollouts (`~/.codex/sessions/…/rollout-*.jsonl`), in both of the forms
//! Codex has written:
//!
//! - **current**: every line is `{"timestamp", "type", "payload"}`; the `payload` of a
//!   `response_item` line is a Responses item, and the other lines (`session_meta`,
//!   `turn_context`, `event_msg` UI events that repeat the items, `compacted` marks) are
//!   skipped;
//! - **older** (Codex before the `payload` lines): the first line is the session's metadata
//!   (`{"id", "timestamp", "instructions"?, "git"?, …}`, no `type`), then one bare Responses
//!   item per line (`message`, `function_call`, `function_call_output`, `local_shell_call`,
//!   `reasoning`), with `{"record_type": "state", …}` snapshots between them, skipped. Some
//!   versions mark lines with other record types: `response` (an item), `event` (a UI event
//!   repeating the items), `session_meta` and `prev_session_meta` (metadata), the last three
//!   skipped.
//!
//! The items are read as any list of Responses items ([`crate::messages`]). A line's RFC 3339
//! `timestamp` (every line of the current form; items of some older versions) is the time of
//! its first event (`timestamp.rs`); the session metadata's is not an event's.

use std::collections::HashMap;

use serde_json::Value;

use crate::{BadInput, Format, Line, Transcript, json_lines, messages, timestamp};

/// Line types of the current rollout form.
const LINE_TYPES: &[&str] = &[
    "session_meta",
    "response_item",
    "turn_context",
    "event_msg",
    "compacted",
];

/// Record types of the older form's lines that are not conversation items.
const LEGACY_SKIPPED: &[&str] = &["state", "event", "session_meta", "prev_session_meta"];

/// Whether a JSON Lines file whose first value is `first` is a Codex rollout of the current
/// form.
pub(crate) fn is_rollout_line(first: &Value) -> bool {
    first.get("payload").is_some()
        && first
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| LINE_TYPES.contains(&t))
}

/// Whether a JSON Lines file whose first value is `first` is a Codex rollout of the older form:
/// session metadata, an object with a string `id` and `timestamp` and neither the `type` of an
/// item or event nor a message's `role`.
pub(crate) fn is_legacy_meta_line(first: &Value) -> bool {
    let Value::Object(obj) = first else {
        return false;
    };
    obj.get("id").is_some_and(Value::is_string)
        && obj.get("timestamp").is_some_and(Value::is_string)
        && !obj.contains_key("type")
        && !obj.contains_key("role")
}

/// Reads a rollout of the current form.
pub(crate) fn read(text: &str) -> Result<Transcript, BadInput> {
    let mut items = Vec::new();
    let mut stamps = HashMap::new();
    for line in json_lines::<Value>(text) {
        let (n, v) = line?;
        let Value::Object(mut obj) = v else {
            return Err(BadInput::at(n, "a rollout line must be a JSON object"));
        };
        match obj.get("type") {
            Some(Value::String(ty)) if ty == "response_item" => {}
            Some(Value::String(_)) => continue,
            _ => return Err(BadInput::at(n, "a rollout line needs a string `type`")),
        }
        if let Some(ms) = timestamp::of_line(n, &obj)? {
            stamps.insert(n, ms);
        }
        match obj.remove("payload") {
            Some(item @ Value::Object(_)) => items.push((n, item)),
            _ => {
                return Err(BadInput::at(
                    n,
                    "a `response_item` line needs a `payload` object",
                ));
            }
        }
    }
    transcript(&items, &stamps)
}

/// Reads a rollout of the older form.
pub(crate) fn read_legacy(text: &str) -> Result<Transcript, BadInput> {
    let mut items = Vec::new();
    let mut stamps = HashMap::new();
    let mut lines = json_lines::<Value>(text);
    // The session's metadata, recognised before this is called.
    if let Some(first) = lines.next() {
        first?;
    }
    for line in lines {
        let (n, v) = line?;
        let Value::Object(obj) = &v else {
            return Err(BadInput::at(n, "a rollout line must be a JSON object"));
        };
        match obj.get("record_type") {
            None => {}
            Some(Value::String(r)) if r == "response" => {}
            Some(Value::String(r)) if LEGACY_SKIPPED.contains(&r.as_str()) => continue,
            Some(Value::String(r)) => {
                return Err(BadInput::at(
                    n,
                    format!(
                        "unknown `record_type` `{r}`; expected response, state, event, session_meta or prev_session_meta"
                    ),
                ));
            }
            Some(_) => return Err(BadInput::at(n, "`record_type` must be a string")),
        }
        if !obj.contains_key("type") {
            return Err(BadInput::at(
                n,
                "a rollout line after the first needs the `type` of a Responses item",
            ));
        }
        if let Some(ms) = timestamp::of_line(n, obj)? {
            stamps.insert(n, ms);
        }
        items.push((n, v));
    }
    transcript(&items, &stamps)
}

fn transcript(
    items: &[(Line, Value)],
    stamps: &HashMap<Line, u64>,
) -> Result<Transcript, BadInput> {
    let refs: Vec<(Line, &Value)> = items.iter().map(|(l, v)| (*l, v)).collect();
    let mut items = messages::read_responses_items(&refs, messages::Mode::Strict)?;
    if !stamps.is_empty() {
        timestamp::place(&mut items, stamps);
    }
    Ok(Transcript {
        format: Format::Messages,
        items,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use crate::{Kind, parse};

    fn strip(text: &str) -> Vec<(u64, Kind)> {
        parse(text)
            .unwrap()
            .items
            .into_iter()
            .map(|i| (i.turn, i.kind))
            .collect()
    }

    /// The older form as Codex wrote it: `SessionMeta`, then `ResponseItem`s serialized with
    /// their `type` tag, with `SessionStateSnapshot` lines flattened beside `record_type`.
    const LEGACY: &str = r#"{"id":"5973b6c0-94b8-487b-a530-2aeb6098ae0e","timestamp":"2025-05-07T17:24:21.123Z","instructions":"Be terse.","git":{"commit_hash":"abc","branch":"main"}}
{"type":"message","id":null,"role":"user","content":[{"type":"input_text","text":"list files"}]}
{"record_type":"state"}
{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"look"}],"encrypted_content":null}
{"type":"function_call","id":"fc_1","name":"shell","arguments":"{\"command\":[\"ls\"]}","call_id":"call_1"}
{"type":"function_call_output","call_id":"call_1","output":"a b"}
{"record_type":"state","previous_response_id":"resp_1"}
{"type":"local_shell_call","id":null,"call_id":"call_2","status":"completed","action":{"type":"exec","command":["ls","-la"],"timeout_ms":null,"working_directory":null,"env":null,"user":null}}
{"type":"function_call_output","call_id":"call_2","output":"total 0"}
{"record_type":"event","id":"0","msg":{"type":"agent_message","message":"Two files."}}
{"record_type":"response","type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Two files."}]}
"#;

    #[test]
    fn an_older_rollout_reads_as_its_responses_items() {
        let t = parse(LEGACY).unwrap();
        assert_eq!(t.format, crate::Format::Messages);
        let items: String = LEGACY
            .lines()
            .skip(1)
            .filter(|l| !l.contains("record_type") || l.contains("\"response\""))
            .collect::<Vec<_>>()
            .join(",\n");
        assert_eq!(strip(LEGACY), strip(&format!("[{items}]")));
        let kinds: Vec<&str> = t.items.iter().map(|i| i.kind.name()).collect();
        assert_eq!(
            kinds,
            ["user", "text", "call", "result", "call", "result", "text"]
        );
        let lines: Vec<usize> = t.items.iter().map(|i| i.line).collect();
        assert_eq!(lines, [2, 4, 4, 6, 8, 9, 11]);
        // Its items carry no time: one second apart.
        let times: Vec<u64> = t.items.iter().map(|i| i.time_ms).collect();
        assert_eq!(times, [0, 1000, 2000, 3000, 4000, 5000, 6000]);
        // Metadata marked with its record type and more keys, as some versions write it.
        let t = parse(
            r#"{"record_type":"session_meta","id":"s","timestamp":"2025-08-01T09:00:00.000Z","cwd":"/repo","originator":"codex_cli_rs","cli_version":"0.20.0"}
{"type":"message","role":"user","content":[{"type":"input_text","text":"go"}]}"#,
        )
        .unwrap();
        assert!(
            matches!(&t.items[..], [i] if matches!(&i.kind, Kind::User { text, .. } if text == "go"))
        );
    }

    #[test]
    fn malformed_older_rollout_lines_are_named() {
        let meta = r#"{"id":"s","timestamp":"2025-05-07T17:24:21.123Z"}"#;
        let ok = r#"{"type":"message","role":"user","content":"go"}"#;
        for (bad, needle) in [
            ("[1]", "must be a JSON object"),
            (r#"{"record_type":"snapshot"}"#, "unknown `record_type`"),
            (r#"{"record_type":7}"#, "`record_type` must be a string"),
            (r#"{"role":"user","content":"x"}"#, "needs the `type`"),
            (
                r#"{"type":"function_call","call_id":"c"}"#,
                "needs a string `name`",
            ),
            (
                r#"{"type":"teleport"}"#,
                "unknown input item type `teleport`",
            ),
            (
                r#"{"type":"message","role":"user","content":"x","timestamp":"noon"}"#,
                "`timestamp` `noon` is not an RFC 3339",
            ),
            (r#"{"type":"message","#, "invalid JSON"),
        ] {
            let text = format!("{meta}\n{ok}\n{bad}\n{ok}\n");
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 3, "{bad}: {e:?}");
            assert!(e.message.contains(needle), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn rollout_timestamps_are_event_times() {
        let text = r#"{"timestamp":"2025-09-01T10:00:00.000Z","type":"session_meta","payload":{"id":"s"}}
{"timestamp":"2025-09-01T10:00:01.000Z","type":"response_item","payload":{"type":"message","role":"user","content":"go"}}
{"timestamp":"2025-09-01T10:00:05.250Z","type":"response_item","payload":{"type":"function_call","call_id":"c1","name":"ls","arguments":"{}"}}
{"timestamp":"2025-09-01T10:00:05.260Z","type":"response_item","payload":{"type":"function_call","call_id":"c2","name":"ls","arguments":"{}"}}
{"timestamp":"2025-09-01T10:00:05.900Z","type":"response_item","payload":{"type":"function_call_output","call_id":"c1","output":"a"}}
{"timestamp":"2025-09-01T10:09:00.000Z","type":"response_item","payload":{"type":"function_call_output","call_id":"c2","output":"b"}}
"#;
        let t = parse(text).unwrap();
        let base = 1_756_720_800_000u64;
        let times: Vec<u64> = t.items.iter().map(|i| i.time_ms - base).collect();
        // The two calls are one assistant message at the line of the first: its second event
        // follows one second later, and the result stamped before that keeps the order.
        assert_eq!(times, [1_000, 5_250, 6_250, 6_250, 540_000]);
        let e = parse(&text.replace("10:09:00.000Z", "10:09:00.000")).unwrap_err();
        assert_eq!(e.line, 6);
        assert!(e.message.contains("RFC 3339"), "{}", e.message);
        let e = parse(&text.replace("\"2025-09-01T10:00:01.000Z\"", "17")).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(
            e.message.contains("`timestamp` must be a string"),
            "{}",
            e.message
        );
    }
}
