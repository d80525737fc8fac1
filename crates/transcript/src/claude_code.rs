//! Claude Code sessions (`~/.claude/projects/<project>/<session>.jsonl`): one JSON object per
//! line, with a `type`.
//!
//! - `user` and `assistant` lines hold an Anthropic message in `message` (`role`, `content`: a
//!   string or blocks with `text`, `thinking`, `tool_use`, `tool_result`), read by the one
//!   reader of chat conversations ([`crate::messages`]).
//! - Every other line (`summary`, `system`, `file-history-snapshot`, `queue-operation`,
//!   `progress`, and types Claude Code adds later) records the session, not the conversation,
//!   and is skipped; so are the `toolUseResult` copies of results on user lines.
//! - Claude Code writes a streamed assistant message as several lines sharing `message.id`,
//!   each with one block (sometimes repeating earlier ones): they are one assistant message,
//!   at the line of its first part, each distinct block read once.
//! - A user line marked `isMeta` (a caveat or command output Claude Code adds) or
//!   `isCompactSummary` (the summary that continues a compacted conversation) is the host's;
//!   an assistant line marked `isApiErrorMessage` (an API error Claude Code shows as a reply,
//!   not the model's) is skipped.
//! - Lines of a subagent (`isSidechain: true`) are a session of their own, named `agent-<id>`
//!   after `agentId` (`sidechain` without one), unless the file holds nothing else.
//!
//! The RFC 3339 `timestamp` of a `user` or `assistant` line is the time of the first event read
//! from it (milliseconds since the epoch), so time-based settings (`ttl`, idle sessions) act on
//! replay as they did live; the message's other events, and those of lines without one, follow
//! one second apart, and time never goes back (`timestamp.rs`). A timestamp that is not RFC
//! 3339 is an error naming its line. Blank lines and lines starting with `//` are skipped; a
//! line that is not a JSON object, has no string `type`, or is a `user`/`assistant` line
//! without a `message` object is an error naming it.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::messages::{Mode, Reader};
use crate::{BadInput, DEFAULT_SESSION, Item, Kind, Line, json_lines, timestamp};

/// Line types that belong to Claude Code sessions and never to loopguard events.
const SESSION_TYPES: &[&str] = &["summary", "file-history-snapshot", "queue-operation"];

/// Keys every Claude Code conversation line carries and no loopguard event has.
const SESSION_KEYS: &[&str] = &["uuid", "parentUuid", "sessionId", "leafUuid", "message"];

/// Whether a JSON Lines file whose first value is `first` is a Claude Code session.
pub(crate) fn is_session_line(first: &Value) -> bool {
    let Some(ty) = first.get("type").and_then(Value::as_str) else {
        return false;
    };
    SESSION_TYPES.contains(&ty) || SESSION_KEYS.iter().any(|k| first.get(*k).is_some())
}

/// One assistant or user message of a stream, being gathered.
struct Entry {
    line: Line,
    message: Value,
    meta: bool,
}

/// The messages of one session (the main conversation or one subagent's).
#[derive(Default)]
struct Stream {
    entries: Vec<Entry>,
    /// Per assistant `message.id`: its entry and the blocks it holds (as JSON text).
    by_id: HashMap<String, (usize, HashSet<String>)>,
}

impl Stream {
    fn push(
        &mut self,
        line: Line,
        message: Map<String, Value>,
        meta: bool,
    ) -> Result<(), BadInput> {
        let id = match message.get("id") {
            Some(Value::String(id))
                if message.get("role").and_then(Value::as_str) == Some("assistant") =>
            {
                Some(id.clone())
            }
            _ => None,
        };
        let Some(id) = id else {
            self.entries.push(Entry {
                line,
                message: Value::Object(message),
                meta,
            });
            return Ok(());
        };
        let blocks = blocks(line, message.get("content"))?;
        if let Some((index, seen)) = self.by_id.get_mut(&id)
            && let Some(Entry {
                message: Value::Object(earlier),
                ..
            }) = self.entries.get_mut(*index)
        {
            let mut content = match earlier.remove("content") {
                Some(Value::Array(content)) => content,
                _ => Vec::new(),
            };
            for block in blocks {
                if seen.insert(block.to_string()) {
                    content.push(block);
                }
            }
            earlier.insert("content".into(), Value::Array(content));
            return Ok(());
        }
        let seen: HashSet<String> = blocks.iter().map(Value::to_string).collect();
        let mut message = message;
        message.insert("content".into(), Value::Array(blocks));
        self.by_id.insert(id, (self.entries.len(), seen));
        self.entries.push(Entry {
            line,
            message: Value::Object(message),
            meta,
        });
        Ok(())
    }
}

/// An assistant message's content as a list of blocks.
fn blocks(line: Line, content: Option<&Value>) -> Result<Vec<Value>, BadInput> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(blocks)) => Ok(blocks.clone()),
        Some(_) => Err(BadInput::at(
            line,
            "`message.content` must be a string or an array of content blocks",
        )),
    }
}

/// Reads a Claude Code session.
pub(crate) fn read(text: &str) -> Result<Vec<Item>, BadInput> {
    // Streams in the order they first appear; the main conversation is `None`.
    let mut streams: Vec<(Option<String>, Stream)> = Vec::new();
    let mut index: HashMap<Option<String>, usize> = HashMap::new();
    let mut stamps: HashMap<Line, u64> = HashMap::new();
    for parsed in json_lines::<Value>(text) {
        let (line, v) = parsed?;
        let Value::Object(mut obj) = v else {
            return Err(BadInput::at(
                line,
                "a Claude Code session line must be a JSON object",
            ));
        };
        let ty = match obj.get("type") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(BadInput::at(line, "`type` must be a string")),
            None => return Err(BadInput::at(line, "the line has no `type`")),
        };
        if ty != "user" && ty != "assistant" {
            continue;
        }
        if let Some(ms) = timestamp::of_line(line, &obj)? {
            stamps.insert(line, ms);
        }
        let mut message = match obj.remove("message") {
            Some(Value::Object(m)) => m,
            Some(_) => {
                return Err(BadInput::at(line, "`message` must be a JSON object"));
            }
            None => {
                return Err(BadInput::at(
                    line,
                    format!("a `{ty}` line needs a `message` object"),
                ));
            }
        };
        match message.get("role") {
            None | Some(Value::Null) => {
                message.insert("role".into(), Value::String(ty.clone()));
            }
            Some(Value::String(role)) if *role == ty => {}
            Some(_) => {
                return Err(BadInput::at(
                    line,
                    format!("`message.role` must be `{ty}` in a `{ty}` line"),
                ));
            }
        }
        let flag = |key: &str| -> Result<bool, BadInput> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(BadInput::at(line, format!("`{key}` must be true or false"))),
            }
        };
        // Claude Code's own words in the model's place (an API error it reports as a reply).
        if flag("isApiErrorMessage")? {
            continue;
        }
        let meta = flag("isMeta")? || flag("isCompactSummary")?;
        let stream = if flag("isSidechain")? {
            Some(match obj.get("agentId").and_then(Value::as_str) {
                Some(agent) => format!("agent-{agent}"),
                None => "sidechain".to_owned(),
            })
        } else {
            None
        };
        let k = *index.entry(stream.clone()).or_insert_with(|| {
            streams.push((stream, Stream::default()));
            streams.len() - 1
        });
        if let Some((_, s)) = streams.get_mut(k) {
            s.push(line, message, meta)?;
        }
    }
    let only_one = streams.len() == 1;
    let mut read = Vec::with_capacity(streams.len());
    for (name, stream) in streams {
        let mut reader = Reader::new(Mode::Strict);
        let mut meta_lines = HashSet::new();
        for entry in &stream.entries {
            if entry.meta {
                meta_lines.insert(entry.line);
            }
            reader.message(entry.line, &entry.message)?;
        }
        let session = match name {
            Some(name) if !only_one => name,
            _ => DEFAULT_SESSION.to_owned(),
        };
        let mut items = reader.finish();
        for item in &mut items {
            item.session.clone_from(&session);
            if meta_lines.contains(&item.line)
                && let Kind::User { injected, .. } = &mut item.kind
            {
                *injected = true;
            }
        }
        read.push(items);
    }
    let mut items = if read.len() <= 1 {
        read.pop().unwrap_or_default()
    } else {
        interleave(read)
    };
    if !stamps.is_empty() {
        timestamp::place(&mut items, &stamps);
    }
    Ok(items)
}

/// The events of several sessions in the order of their lines, numbered as one transcript:
/// one second apart, each session's assistant messages a turn of their own.
fn interleave(sessions: Vec<Vec<Item>>) -> Vec<Item> {
    let mut all: Vec<(usize, Item)> = sessions
        .into_iter()
        .enumerate()
        .flat_map(|(s, items)| items.into_iter().map(move |i| (s, i)))
        .collect();
    // Stable: a session's own order is kept among events of one line.
    all.sort_by_key(|(_, i)| i.line);
    // Per session, its latest turn and the number it was given.
    let mut last_turn: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut turn = 0u64;
    let mut out = Vec::with_capacity(all.len());
    for (k, (s, mut item)) in all.into_iter().enumerate() {
        let own = item.turn;
        if own != 0 {
            item.turn = match last_turn.get(&s) {
                Some(&(o, global)) if o == own => global,
                _ => {
                    turn += 1;
                    last_turn.insert(s, (own, turn));
                    turn
                }
            };
        }
        item.time_ms = (k as u64) * 1000;
        out.push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::{Format, parse};

    fn kinds(items: &[Item]) -> Vec<&'static str> {
        items.iter().map(|i| i.kind.name()).collect()
    }

    fn strip(items: &[Item]) -> Vec<(u64, Kind)> {
        items.iter().map(|i| (i.turn, i.kind.clone())).collect()
    }

    #[test]
    fn a_session_reads_as_its_anthropic_messages() {
        let session = r#"{"type":"summary","summary":"Fixing a test","leafUuid":"u4"}
{"type":"file-history-snapshot","messageId":"m0","snapshot":{}}
{"type":"user","uuid":"u1","parentUuid":null,"sessionId":"s","message":{"role":"user","content":"fix it"}}
{"type":"assistant","uuid":"u2","parentUuid":"u1","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"thinking","thinking":"hmm","signature":"x"}]}}
{"type":"assistant","uuid":"u3","parentUuid":"u2","message":{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Reading."}]}}
{"type":"assistant","uuid":"u4","parentUuid":"u3","message":{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"a.rs"}}]}}
{"type":"system","subtype":"informational","content":"hook ran","level":"info"}
{"type":"user","uuid":"u5","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"no such file","is_error":true}]},"toolUseResult":"Error: no such file"}
{"type":"assistant","uuid":"u6","message":{"id":"msg_2","role":"assistant","content":[{"type":"text","text":"Done."}]}}
"#;
        let t = parse(session).unwrap();
        assert_eq!(t.format, Format::ClaudeCode);
        let anthropic = parse(
            r#"[
{"role":"user","content":"fix it"},
{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Reading."},{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"a.rs"}}]},
{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"no such file","is_error":true}]},
{"role":"assistant","content":"Done."}
]"#,
        )
        .unwrap();
        assert_eq!(strip(&t.items), strip(&anthropic.items));
        let lines: Vec<Line> = t.items.iter().map(|i| i.line).collect();
        assert_eq!(lines, [3, 4, 4, 4, 8, 9]);
    }

    #[test]
    fn repeated_streaming_lines_read_each_block_once() {
        // Some versions write the message so far on every line.
        let session = r#"{"type":"assistant","sessionId":"s","message":{"id":"m","role":"assistant","content":[{"type":"text","text":"Two reads."}]}}
{"type":"assistant","sessionId":"s","message":{"id":"m","role":"assistant","content":[{"type":"text","text":"Two reads."},{"type":"tool_use","id":"a","name":"Read","input":{"file_path":"x"}}]}}
{"type":"user","sessionId":"s","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"X"}]}}
{"type":"assistant","sessionId":"s","message":{"id":"m","role":"assistant","content":[{"type":"tool_use","id":"b","name":"Read","input":{"file_path":"y"}}]}}
{"type":"user","sessionId":"s","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"b","content":"Y"}]}}
"#;
        let t = parse(session).unwrap();
        assert_eq!(
            kinds(&t.items),
            ["text", "call", "call", "result", "result"]
        );
        assert!(t.items.iter().all(|i| i.turn == 1 || i.turn == 0));
    }

    #[test]
    fn meta_lines_are_the_hosts_and_sidechains_are_sessions_of_their_own() {
        let session = r#"{"type":"user","sessionId":"s","isMeta":true,"message":{"role":"user","content":"Caveat: the messages below were generated by local commands"}}
{"type":"user","sessionId":"s","message":{"role":"user","content":"look around"}}
{"type":"assistant","sessionId":"s","isApiErrorMessage":true,"message":{"id":"e","role":"assistant","model":"<synthetic>","content":[{"type":"text","text":"API Error: 529 overloaded"}]}}
{"type":"assistant","sessionId":"s","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"task","name":"Task","input":{"prompt":"search"}}]}}
{"type":"user","sessionId":"s","isSidechain":true,"agentId":"a1","message":{"role":"user","content":"search"}}
{"type":"assistant","sessionId":"s","isSidechain":true,"agentId":"a1","message":{"id":"m2","role":"assistant","content":[{"type":"tool_use","id":"g","name":"Grep","input":{"pattern":"x"}}]}}
{"type":"user","sessionId":"s","isSidechain":true,"agentId":"a1","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"g","content":"none"}]}}
{"type":"user","sessionId":"s","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"task","content":"nothing found"}]}}
"#;
        let t = parse(session).unwrap();
        let seen: Vec<(&str, &str, u64)> = t
            .items
            .iter()
            .map(|i| (i.session.as_str(), i.kind.name(), i.turn))
            .collect();
        assert_eq!(
            seen,
            [
                ("main", "user", 0),
                ("main", "user", 0),
                ("main", "call", 1),
                ("agent-a1", "user", 0),
                ("agent-a1", "call", 2),
                ("agent-a1", "result", 2),
                ("main", "result", 1),
            ]
        );
        assert!(matches!(
            &t.items[0].kind,
            Kind::User { injected: true, .. }
        ));
        assert!(matches!(
            &t.items[1].kind,
            Kind::User {
                injected: false,
                ..
            }
        ));
        let times: Vec<u64> = t.items.iter().map(|i| i.time_ms).collect();
        assert_eq!(times, [0, 1000, 2000, 3000, 4000, 5000, 6000]);
        // A subagent's own file is its main session.
        let own: String = session
            .lines()
            .skip(4)
            .take(3)
            .collect::<Vec<_>>()
            .join("\n");
        let t = parse(&own).unwrap();
        assert!(t.items.iter().all(|i| i.session == "main"));
    }

    #[test]
    fn line_timestamps_are_event_times() {
        let session = r#"{"type":"summary","summary":"s","leafUuid":"u1","timestamp":"not a time"}
{"type":"user","sessionId":"s","timestamp":"2025-06-01T12:34:56.789Z","message":{"role":"user","content":"go"}}
{"type":"assistant","sessionId":"s","timestamp":"2025-06-01T12:35:00.000Z","message":{"id":"m","role":"assistant","content":[{"type":"text","text":"Two reads."}]}}
{"type":"assistant","sessionId":"s","timestamp":"2025-06-01T12:35:00.500Z","message":{"id":"m","role":"assistant","content":[{"type":"tool_use","id":"a","name":"Read","input":{"file_path":"x"}}]}}
{"type":"user","sessionId":"s","timestamp":"2025-06-01T12:35:00.700Z","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"X"}]}}
{"type":"user","sessionId":"s","message":{"role":"user","content":"again"}}
{"type":"user","sessionId":"s","isSidechain":true,"agentId":"b","timestamp":"2025-06-01T13:00:00+01:00","message":{"role":"user","content":"search"}}
{"type":"user","sessionId":"s","timestamp":"2025-06-01T12:36:00Z","message":{"role":"user","content":"later"}}
"#;
        let t = parse(session).unwrap();
        let base = 1_748_781_296_789u64;
        let seen: Vec<(&str, &str, u64)> = t
            .items
            .iter()
            .map(|i| (i.session.as_str(), i.kind.name(), i.time_ms - base))
            .collect();
        assert_eq!(
            seen,
            [
                ("main", "user", 0),
                // The streamed message's lines are one message, at its first line's time.
                ("main", "text", 3_211),
                ("main", "call", 4_211),
                // Stamped before the call it answers was placed: kept after it.
                ("main", "result", 4_211),
                // No timestamp: one second after.
                ("main", "user", 5_211),
                // 12:00 UTC, before the previous event: not placed back in time.
                ("agent-b", "user", 5_211),
                ("main", "user", 63_211),
            ]
        );
    }

    #[test]
    fn malformed_lines_are_named() {
        let ok = r#"{"type":"user","sessionId":"s","message":{"role":"user","content":"go"}}"#;
        for (bad, needle) in [
            ("[1]", "must be a JSON object"),
            (r#"{"sessionId":"s"}"#, "no `type`"),
            (r#"{"type":3,"sessionId":"s"}"#, "`type` must be a string"),
            (
                r#"{"type":"user","sessionId":"s"}"#,
                "needs a `message` object",
            ),
            (
                r#"{"type":"user","message":"hi"}"#,
                "`message` must be a JSON object",
            ),
            (
                r#"{"type":"user","message":{"role":"assistant","content":"x"}}"#,
                "`message.role` must be `user`",
            ),
            (
                r#"{"type":"assistant","message":{"id":"m","role":"assistant","content":7}}"#,
                "`message.content` must be",
            ),
            (
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"tool_use","id":"t"}]}}"#,
                "needs a string `name`",
            ),
            (
                r#"{"type":"user","isMeta":"yes","message":{"role":"user","content":"x"}}"#,
                "`isMeta` must be true or false",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":[{"type":"mystery"}]}}"#,
                "unknown content block type `mystery`",
            ),
            (r#"{"type":"user","message":{"#, "invalid JSON"),
            (
                r#"{"type":"user","timestamp":"2025-06-01T25:00:00Z","message":{"role":"user","content":"x"}}"#,
                "`timestamp` `2025-06-01T25:00:00Z` is not an RFC 3339",
            ),
            (
                r#"{"type":"user","timestamp":1748781296,"message":{"role":"user","content":"x"}}"#,
                "`timestamp` must be a string",
            ),
        ] {
            let text = format!("{ok}\n\n{bad}\n{ok}\n");
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 3, "{bad}: {e:?}");
            assert!(e.message.contains(needle), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn deep_and_long_sessions_stay_bounded() {
        let deep = format!(
            "{{\"type\":\"user\",\"sessionId\":\"s\",\"message\":{{\"role\":\"user\",\"content\":{}\"x\"{}}}}}",
            "[".repeat(50_000),
            "]".repeat(50_000)
        );
        assert!(parse(&deep).is_err());
        // One message id on many lines: each block compared once, not against every other.
        let n = 20_000;
        let mut text = String::new();
        for i in 0..n {
            text.push_str(&format!(
                "{{\"type\":\"assistant\",\"sessionId\":\"s\",\"message\":{{\"id\":\"m\",\"role\":\"assistant\",\"content\":[{{\"type\":\"tool_use\",\"id\":\"t{i}\",\"name\":\"Read\",\"input\":{{}}}}]}}}}\n"
            ));
        }
        let start = std::time::Instant::now();
        let t = parse(&text).unwrap();
        assert_eq!(t.items.len(), n);
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}
