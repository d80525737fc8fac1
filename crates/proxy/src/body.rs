//! A request body read lazily: its top-level members and its conversation's messages stay raw
//! JSON slices of the client's bytes until something needs one of them as a value.
//!
//! A client sends the whole conversation (and its tool definitions) with every request, but the
//! proxy needs little of it: a few small members (`model`, `stream`, …), the role of each
//! message, and the messages after the last assistant message. Building a `serde_json::Value`
//! of all of it on every request would make each turn cost the size of the whole history. Here
//! the body is split once into slices (the JSON is still checked whole), each message's role is
//! read without allocating, and only what is used is parsed. When nothing is changed, the
//! client's bytes go upstream as they came; otherwise the body is written out again from its
//! slices and the changed values.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// A member or message: the client's JSON text, parsed when first needed; written back as the
/// text unless the proxy changed it.
#[derive(Debug, Clone)]
struct Slot<'a> {
    raw: Option<&'a str>,
    value: Option<Value>,
    changed: bool,
}

impl<'a> Slot<'a> {
    fn raw(raw: &'a str) -> Slot<'a> {
        Slot {
            raw: Some(raw),
            value: None,
            changed: false,
        }
    }

    fn parsed(v: Value) -> Slot<'a> {
        Slot {
            raw: None,
            value: Some(v),
            changed: true,
        }
    }

    fn value(&mut self) -> &mut Value {
        let raw = self.raw;
        // A slice of a body whose parse already checked the whole: it parses again.
        self.value.get_or_insert_with(|| {
            raw.and_then(|r| serde_json::from_str(r).ok())
                .unwrap_or(Value::Null)
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        match (self.raw, &self.value) {
            (Some(raw), _) if !self.changed => out.extend_from_slice(raw.as_bytes()),
            (_, Some(v)) => {
                let _ = serde_json::to_writer(&mut *out, v);
            }
            (Some(raw), None) => out.extend_from_slice(raw.as_bytes()),
            (None, None) => out.extend_from_slice(b"null"),
        }
    }

    fn raw_text(&self) -> Option<&str> {
        if self.changed {
            return None;
        }
        self.raw
    }
}

/// What the proxy needs of a message without parsing it: its role and type, and (Anthropic)
/// the types of its content blocks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Peek {
    /// `role`.
    pub role: Option<Name>,
    /// `type` (Responses items).
    pub kind: Option<Name>,
    /// Whether its content holds a block of type `tool_result`.
    pub has_results: bool,
    /// Whether its content holds a block of type `tool_use`.
    pub has_calls: bool,
    /// Whether it has `tool_calls` (OpenAI chat).
    pub has_tool_calls: bool,
}

/// A role or an item type: the common ones without an allocation.
pub type Name = Cow<'static, str>;

/// `text` as a [`Name`].
pub fn name(text: &str) -> Name {
    const KNOWN: [&str; 12] = [
        "user",
        "assistant",
        "tool",
        "system",
        "developer",
        "function",
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "tool_use",
        "tool_result",
    ];
    match KNOWN.iter().find(|k| **k == text) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(text.to_owned()),
    }
}

/// One message, as read by a peek: only the keys the proxy looks at are read; the others are
/// skipped without allocating.
#[derive(Deserialize)]
struct PeekFields<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Option<Blocks>,
    #[serde(default)]
    tool_calls: Option<Present>,
}

/// Whether a key holds anything but `null`.
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Option::<IgnoredAny>::deserialize(d)?;
        Ok(Present(v.is_some()))
    }
}

/// The block types of message content (a string has none).
#[derive(Default)]
struct Blocks {
    results: bool,
    calls: bool,
}

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Blocks;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("message content")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Blocks, E> {
                Ok(Blocks::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Blocks, E> {
                Ok(Blocks::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blocks, A::Error> {
                let mut b = Blocks::default();
                while let Some(block) = seq.next_element::<BlockType>()? {
                    match block.0.as_deref() {
                        Some("tool_result") => b.results = true,
                        Some("tool_use") => b.calls = true,
                        _ => {}
                    }
                }
                Ok(b)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Blocks, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Blocks::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// A content block's `type`, the rest skipped.
struct BlockType(Option<String>);

impl<'de> Deserialize<'de> for BlockType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BlockType;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a content block")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BlockType, A::Error> {
                let mut ty = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "type" {
                        ty = map
                            .next_value::<Option<Cow<'de, str>>>()?
                            .map(Cow::into_owned);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(BlockType(ty))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BlockType, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(BlockType(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<BlockType, E> {
                Ok(BlockType(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads what the proxy needs of a message's JSON text.
fn peek_fast(text: &str) -> Peek {
    crate::scan::peek(text).unwrap_or_else(|| peek_text(text))
}

/// Reads what the proxy needs of a message's JSON text with `serde_json`.
pub(crate) fn peek_text(text: &str) -> Peek {
    match serde_json::from_str::<PeekFields<'_>>(text) {
        Ok(f) => Peek {
            role: f.role.as_deref().map(name),
            kind: f.kind.as_deref().map(name),
            has_results: f.content.as_ref().is_some_and(|b| b.results),
            has_calls: f.content.as_ref().is_some_and(|b| b.calls),
            has_tool_calls: f.tool_calls.is_some_and(|p| p.0),
        },
        Err(_) => Peek::default(),
    }
}

/// What a peek reads of an already parsed message.
fn peek_value(v: &Value) -> Peek {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(name);
    let blocks = v.get("content").and_then(Value::as_array);
    let has = |ty: &str| {
        blocks.is_some_and(|b| {
            b.iter()
                .any(|x| x.get("type").and_then(Value::as_str) == Some(ty))
        })
    };
    Peek {
        role: text("role"),
        kind: text("type"),
        has_results: has("tool_result"),
        has_calls: has("tool_use"),
        has_tool_calls: v.get("tool_calls").is_some_and(|t| !t.is_null()),
    }
}

/// The messages of a conversation (a chat `messages` list or a Responses `input` list).
#[derive(Debug, Clone, Default)]
pub struct Messages<'a> {
    slots: Vec<Slot<'a>>,
    /// Each message's peek, read once.
    peeks: Vec<Option<Peek>>,
    changed: bool,
}

impl<'a> Messages<'a> {
    /// Messages already parsed (a conversation built by the proxy itself, tests).
    pub fn from_values(values: Vec<Value>) -> Messages<'a> {
        let n = values.len();
        Messages {
            slots: values.into_iter().map(Slot::parsed).collect(),
            peeks: vec![None; n],
            changed: false,
        }
    }

    /// How many messages there are.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether a message was changed, added or removed.
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// What the proxy needs of message `i` (read once, without parsing it).
    pub fn peek(&mut self, i: usize) -> &Peek {
        static NONE: Peek = Peek {
            role: None,
            kind: None,
            has_results: false,
            has_calls: false,
            has_tool_calls: false,
        };
        if !matches!(self.peeks.get(i), Some(Some(_))) {
            let p = self.read_peek(i);
            if let Some(slot) = self.peeks.get_mut(i) {
                *slot = Some(p);
            }
        }
        match self.peeks.get(i) {
            Some(Some(p)) => p,
            _ => &NONE,
        }
    }

    fn read_peek(&self, i: usize) -> Peek {
        match self.slots.get(i) {
            Some(Slot {
                value: Some(v),
                changed: true,
                ..
            }) => peek_value(v),
            Some(Slot { raw: Some(raw), .. }) => peek_fast(raw),
            Some(Slot { value: Some(v), .. }) => peek_value(v),
            _ => Peek::default(),
        }
    }

    /// The JSON text of message `i` as the client sent it (`None` once the proxy parsed it).
    pub fn raw(&self, i: usize) -> Option<&str> {
        self.slots.get(i).and_then(Slot::raw_text)
    }

    /// Message `i`, parsed.
    pub fn get(&mut self, i: usize) -> Option<&Value> {
        self.slots.get_mut(i).map(|s| &*s.value())
    }

    /// Message `i`, parsed, to change (the conversation counts as changed).
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Value> {
        self.changed = true;
        if let Some(p) = self.peeks.get_mut(i) {
            *p = None;
        }
        self.slots.get_mut(i).map(|s| {
            s.changed = true;
            s.value()
        })
    }

    /// Messages `from..`, parsed (copies).
    pub fn values(&mut self, from: usize) -> Vec<Value> {
        (from..self.len())
            .filter_map(|i| self.get(i).cloned())
            .collect()
    }

    /// Inserts a message at `i`.
    pub fn insert(&mut self, i: usize, v: Value) {
        let i = i.min(self.slots.len());
        self.slots.insert(i, Slot::parsed(v));
        self.peeks.insert(i, None);
        self.changed = true;
    }

    /// Appends a message.
    pub fn push(&mut self, v: Value) {
        self.insert(self.len(), v);
    }

    /// Removes message `i`.
    pub fn remove(&mut self, i: usize) {
        if i < self.slots.len() {
            self.slots.remove(i);
            self.peeks.remove(i);
            self.changed = true;
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, s) in self.slots.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            s.write(out);
        }
        out.push(b']');
    }
}

/// A request body that is not a JSON object, or not JSON.
#[derive(Debug)]
pub struct NotAnObject(pub String);

/// The top-level members of a JSON object, in order, each as its raw text.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'a>, A::Error> {
                let mut out: Vec<(Cow<'a, str>, &'a RawValue)> = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    // A repeated key: the last one counts, as serde_json's maps take it.
                    out.retain(|(k, _)| *k != key);
                    out.push((key, value));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A request body: its members, with the conversation (under `list_key`) as [`Messages`].
#[derive(Debug, Clone)]
pub struct Body<'a> {
    members: Vec<(Cow<'a, str>, Slot<'a>)>,
    list_key: &'static str,
    /// The conversation, when the member is a list (or a Responses text `input`, made a list).
    pub messages: Option<Messages<'a>>,
    /// A member was changed.
    changed: bool,
}

impl<'a> Body<'a> {
    /// Splits a JSON object into its members; the conversation under `list_key` into messages
    /// (a string under it — Responses' text `input` — is read as one user message, which counts
    /// as a change).
    pub fn parse(bytes: &'a [u8], list_key: &'static str) -> Result<Body<'a>, NotAnObject> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| NotAnObject(format!("the request body is not UTF-8: {e}")))?;
        let first = text.trim_start().as_bytes().first().copied();
        if first != Some(b'{') {
            // Checked as JSON first, for the better message.
            return Err(NotAnObject(
                match serde_json::from_str::<IgnoredAny>(text) {
                    Ok(_) => "the request body must be a JSON object".to_owned(),
                    Err(e) => format!("the request body is not valid JSON: {e}"),
                },
            ));
        }
        let Members(members) = serde_json::from_str::<Members<'a>>(text)
            .map_err(|e| NotAnObject(format!("the request body is not valid JSON: {e}")))?;
        let mut messages = None;
        let mut changed = false;
        let members = members
            .into_iter()
            .map(|(k, raw)| {
                let raw = raw.get();
                if k == list_key {
                    let t = raw.trim_start();
                    // The body parsed whole, so a list's elements can be found by its structure.
                    if t.starts_with('[')
                        && let Some(list) = crate::scan::peeked_elements(raw)
                    {
                        let (slots, peeks) =
                            list.into_iter().map(|(m, p)| (Slot::raw(m), p)).unzip();
                        messages = Some(Messages {
                            slots,
                            peeks,
                            changed: false,
                        });
                    } else if t.starts_with('"')
                        && let Ok(s) = serde_json::from_str::<String>(raw)
                    {
                        messages = Some(Messages::from_values(vec![
                            serde_json::json!({"role": "user", "content": s}),
                        ]));
                        changed = true;
                    }
                }
                (k, Slot::raw(raw))
            })
            .collect();
        Ok(Body {
            members,
            list_key,
            messages,
            changed,
        })
    }

    /// A body from a parsed value (tests, fuzzing, retries).
    pub fn from_value(v: &Value, list_key: &'static str) -> Option<Body<'static>> {
        let obj = v.as_object()?;
        let mut messages = None;
        let members = obj
            .iter()
            .map(|(k, v)| {
                if k == list_key {
                    match v {
                        Value::Array(list) => messages = Some(Messages::from_values(list.clone())),
                        Value::String(s) => {
                            messages = Some(Messages::from_values(vec![
                                serde_json::json!({"role": "user", "content": s}),
                            ]));
                        }
                        _ => {}
                    }
                }
                (Cow::Owned(k.clone()), Slot::parsed(v.clone()))
            })
            .collect();
        Some(Body {
            members,
            list_key,
            messages,
            changed: false,
        })
    }

    /// A top-level member, parsed.
    pub fn get(&mut self, key: &str) -> Option<&Value> {
        self.members
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, s)| &*s.value())
    }

    /// A top-level member's text, when it is a string.
    pub fn text(&mut self, key: &str) -> Option<String> {
        self.get(key).and_then(Value::as_str).map(str::to_owned)
    }

    /// Whether the proxy changed anything (the body must then be written out again).
    pub fn changed(&self) -> bool {
        self.changed || self.messages.as_ref().is_some_and(Messages::changed)
    }

    /// The body as JSON bytes: the members as the client sent them, the changed ones and the
    /// conversation written out again.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(b'{');
        for (i, (k, slot)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = serde_json::to_writer(&mut out, k.as_ref());
            out.push(b':');
            match (&self.messages, k == self.list_key) {
                (Some(m), true) => m.write(&mut out),
                _ => slot.write(&mut out),
            }
        }
        out.push(b'}');
        out
    }

    /// The body as a value (for asking the upstream again with more appended).
    pub fn to_value(&self) -> Value {
        serde_json::from_slice(&self.to_bytes()).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn an_unchanged_body_is_written_as_it_came_and_a_changed_one_as_json() {
        let text = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi \u00e9"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]}],"tools":[{"a":1}]}"#;
        let mut body = Body::parse(text, "messages").unwrap();
        assert!(!body.changed());
        assert_eq!(body.text("model").as_deref(), Some("m"));
        assert_eq!(body.get("stream"), Some(&json!(true)));
        let msgs = body.messages.as_mut().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs.peek(1).role.as_deref(), Some("assistant"));
        assert!(msgs.peek(1).has_tool_calls);
        assert_eq!(
            msgs.raw(0),
            Some(r#"{"role":"user","content":"hi \u00e9"}"#)
        );
        assert_eq!(
            body.to_bytes(),
            text.to_vec(),
            "slices written back as they came"
        );
        let msgs = body.messages.as_mut().unwrap();
        msgs.get_mut(0).unwrap()["content"] = json!("changed");
        msgs.push(json!({"role": "system", "content": "note"}));
        assert!(body.changed());
        let v: Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert_eq!(v["messages"][0]["content"], "changed");
        assert_eq!(v["messages"][2]["role"], "system");
        assert_eq!(v["tools"], json!([{"a": 1}]));
    }

    #[test]
    fn peeks_see_roles_types_and_block_types_without_parsing() {
        for (text, want) in [
            (
                r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}"#,
                Peek {
                    role: Some("user".into()),
                    has_results: true,
                    ..Peek::default()
                },
            ),
            (
                r#"{"content":[{"text":"a","type":"tool_use"}],"role":"assistant"}"#,
                Peek {
                    role: Some("assistant".into()),
                    has_calls: true,
                    ..Peek::default()
                },
            ),
            (
                r#"{"type":"function_call","call_id":"c","arguments":"{\"type\":\"tool_use\"}"}"#,
                Peek {
                    kind: Some("function_call".into()),
                    ..Peek::default()
                },
            ),
            (
                r#"{"role":"tool","content":"x","tool_calls":null}"#,
                Peek {
                    role: Some("tool".into()),
                    ..Peek::default()
                },
            ),
            ("[1,2]", Peek::default()),
        ] {
            assert_eq!(peek_text(text), want, "{text}");
            assert_eq!(peek_fast(text), want, "{text}");
            if text.starts_with('{') {
                assert_eq!(crate::scan::peek(text), Some(want.clone()), "{text}");
            }
            let v: Value = serde_json::from_str(text).unwrap();
            assert_eq!(peek_value(&v), want, "{text}");
        }
    }

    #[test]
    fn a_text_input_is_one_user_message_and_bad_bodies_are_refused() {
        let mut body = Body::parse(br#"{"model":"m","input":"fix it"}"#, "input").unwrap();
        assert!(body.changed());
        let v: Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert_eq!(v["input"], json!([{"role": "user", "content": "fix it"}]));
        assert_eq!(body.messages.as_mut().unwrap().len(), 1);
        for bad in [&b"[1]"[..], b"nope", b"{\"a\":", b"", b"\xff{}"] {
            assert!(Body::parse(bad, "messages").is_err());
        }
        let dup = Body::parse(br#"{"model":"a","model":"b"}"#, "messages").unwrap();
        assert_eq!(dup.to_bytes(), br#"{"model":"b"}"#.to_vec());
    }
}
