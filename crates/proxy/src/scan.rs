//! Walks JSON text that a parser has already checked, without building values: where a value
//! ends, the elements of an array, and what a [`Peek`] reads of a message.
//!
//! A request's history is most of its bytes, and most of those are the text of messages. These
//! walks jump from quote to quote inside strings (`memchr`), so they cost little more than a
//! pass over the structure. They never decide what the text means where it could differ from
//! `serde_json`: a key or a read string with an escape in it, a repeated field, a value of an
//! unexpected type give `None`, and the caller reads that message with `serde_json` instead.
//! On text that is not JSON they stop with `None` as well; they never panic and never read
//! past the text.

use crate::body::{Name, Peek, name};

/// Index past the whitespace from `i`.
fn ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// Index just past the string whose opening quote is at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = j + memchr::memchr(b'"', b.get(j..)?)?;
        // The quote is escaped when an odd number of backslashes stands before it. The run
        // cannot reach back past `j`: the byte before `j` is a quote.
        let run = b
            .get(j..k)?
            .iter()
            .rev()
            .take_while(|&&c| c == b'\\')
            .count();
        if run % 2 == 0 {
            return Some(k + 1);
        }
        j = k + 1;
    }
}

/// Index just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b
                .get(j)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The elements of the array `text` (`[…]`, whitespace around it allowed), each as its text.
pub fn elements(text: &str) -> Option<Vec<&str>> {
    each_element(text, |b, i| Some((value_end(b, i)?, ())))
        .map(|list| list.into_iter().map(|(t, ())| t).collect())
}

/// The elements of the array `text`, each as its text with what `read(bytes, start)` makes of
/// it; `read` also says where the element ends.
fn each_element<T>(
    text: &str,
    mut read: impl FnMut(&[u8], usize) -> Option<(usize, T)>,
) -> Option<Vec<(&str, T)>> {
    let b = text.as_bytes();
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = ws(b, i + 1);
    // A message takes a few hundred bytes at least.
    let mut out = Vec::with_capacity(text.len() / 256 + 4);
    if b.get(i) == Some(&b']') {
        return (ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        let (end, x) = read(b, i)?;
        out.push((text.get(i..end)?, x));
        i = ws(b, end);
        match *b.get(i)? {
            b',' => i = ws(b, i + 1),
            b']' => return (ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

/// The members of the object that starts at `i`: calls `each(key, value start, value end)`
/// for each, in order, and returns the index past the object. A key with an escape in it, or
/// `each` returning `None`, gives `None`.
fn members(
    b: &[u8],
    i: usize,
    mut each: impl FnMut(&[u8], usize, usize) -> Option<()>,
) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(b, i)?;
        let key = b.get(i + 1..key_end - 1)?;
        if key.contains(&b'\\') {
            return None;
        }
        i = ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = ws(b, i + 1);
        let end = value_end(b, start)?;
        each(key, start, end)?;
        i = ws(b, end);
        match *b.get(i)? {
            b',' => i = ws(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// A string or `null` value at `start..end`, as `serde_json` reads it into an
/// `Option<String>`; `None` for any other value and for a string with an escape.
fn plain_text(b: &[u8], start: usize, end: usize) -> Option<Option<Name>> {
    let v = b.get(start..end)?;
    if v == b"null" {
        return Some(None);
    }
    let inner = v.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') {
        return None;
    }
    Some(Some(name(std::str::from_utf8(inner).ok()?)))
}

/// Whether message content at `start` holds blocks of type `tool_result` and `tool_use`.
fn blocks(b: &[u8], start: usize, end: usize) -> Option<(bool, bool)> {
    match *b.get(start)? {
        // Text content, none, or an object: no blocks.
        b'"' | b'n' | b'{' => Some((false, false)),
        b'[' => {
            let text = std::str::from_utf8(b.get(start..end)?).ok()?;
            let (mut results, mut calls) = (false, false);
            for block in elements(text)? {
                let bb = block.as_bytes();
                if bb.first() != Some(&b'{') {
                    // A string, a number, a list: a block without a type.
                    continue;
                }
                let mut ty = None;
                members(bb, 0, |key, s, e| {
                    if key == b"type" {
                        ty = plain_text(bb, s, e)?;
                    }
                    Some(())
                })?;
                match ty.as_deref() {
                    Some("tool_result") => results = true,
                    Some("tool_use") => calls = true,
                    _ => {}
                }
            }
            Some((results, calls))
        }
        _ => None,
    }
}

/// What [`Peek`] reads of the message `text`, or `None` when `serde_json` must read it.
pub fn peek(text: &str) -> Option<Peek> {
    let b = text.as_bytes();
    let (end, p) = peek_at(b, ws(b, 0))?;
    (ws(b, end) == b.len()).then_some(p)
}

/// The elements of the array `text`, as [`elements`] finds them, each with what [`peek`]
/// reads of it (`None` where `serde_json` must read it): one walk for both.
pub fn peeked_elements(text: &str) -> Option<Vec<(&str, Option<Peek>)>> {
    each_element(text, |b, i| match peek_at(b, i) {
        Some((end, p)) => Some((end, Some(p))),
        None => Some((value_end(b, i)?, None)),
    })
}

/// What [`Peek`] reads of the object that starts at `i`, and the index past it.
fn peek_at(b: &[u8], i: usize) -> Option<(usize, Peek)> {
    let mut p = Peek::default();
    let mut seen = [false; 4];
    let end = members(b, i, |key, s, e| {
        let field = match key {
            b"role" => 0,
            b"type" => 1,
            b"content" => 2,
            b"tool_calls" => 3,
            _ => return Some(()),
        };
        // A repeated field is an error to `serde_json`.
        if std::mem::replace(&mut seen[field], true) {
            return None;
        }
        match field {
            0 => p.role = plain_text(b, s, e)?,
            1 => p.kind = plain_text(b, s, e)?,
            2 => (p.has_results, p.has_calls) = blocks(b, s, e)?,
            _ => p.has_tool_calls = b.get(s..e)? != b"null",
        }
        Some(())
    })?;
    Some((end, p))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    #[test]
    fn arrays_split_into_their_elements() {
        assert_eq!(
            elements(r#" [ {"a":"x]\"}"} , [1,[2]],"s\\" ,null,-1.5e3 ] "#).unwrap(),
            [r#"{"a":"x]\"}"}"#, "[1,[2]]", r#""s\\""#, "null", "-1.5e3"]
        );
        assert_eq!(elements("[]").unwrap(), Vec::<&str>::new());
        for bad in ["", "{}", "[1", "[1,", "[1 2]", "[\"a]", "[1]x", "[}"] {
            assert_eq!(elements(bad), None, "{bad}");
        }
    }

    #[test]
    fn peeks_that_serde_json_must_read_are_left_to_it() {
        for text in [
            r#"{"role":"us\u0065r"}"#,
            r#"{"r\u006fle":"user"}"#,
            r#"{"role":"user","role":"tool"}"#,
            r#"{"role":1}"#,
            r#"{"content":true}"#,
            r#"{"content":[{"type":3}]}"#,
            "[1,2]",
            "{",
        ] {
            assert_eq!(peek(text), None, "{text}");
        }
        assert_eq!(
            peek(
                r#"{"content":[{"type":"tool_use"},"x",{"type":null},{"type":"a","type":"tool_result"}],"role":null}"#
            ),
            Some(Peek {
                has_results: true,
                has_calls: true,
                ..Peek::default()
            })
        );
    }

    /// JSON values shaped like messages: the fields a peek reads, with values of every kind.
    fn message() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            prop_oneof![
                Just("user"),
                Just("assistant"),
                Just("tool"),
                Just("tool_use"),
                Just("tool_result"),
                Just("function_call"),
                Just("a\"b\\c\u{e9}\n"),
                Just(""),
            ]
            .prop_map(|s| json!(s)),
        ];
        let any_value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![Just("type"), Just("text"), Just("role"), Just("x")],
                        inner
                    ),
                    0..4
                )
                .prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        });
        prop::collection::vec(
            (
                prop_oneof![
                    Just("role"),
                    Just("type"),
                    Just("content"),
                    Just("tool_calls"),
                    Just("name"),
                ],
                any_value,
            ),
            0..6,
        )
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
    }

    /// Writes `v` as JSON with the spacing and escapes a client might use.
    fn written(v: &Value, pretty: bool, escape_keys: bool) -> String {
        let text = if pretty {
            serde_json::to_string_pretty(v).unwrap()
        } else {
            serde_json::to_string(v).unwrap()
        };
        if escape_keys {
            text.replace("\"role\"", "\"r\\u006fle\"")
        } else {
            text
        }
    }

    proptest! {
        #[test]
        fn a_peek_reads_what_serde_json_reads(
            v in message(),
            pretty in any::<bool>(),
            escape_keys in any::<bool>(),
            repeat in any::<bool>(),
        ) {
            let mut text = written(&v, pretty, escape_keys);
            if repeat && text.len() > 2 {
                // The same member twice.
                text = format!("{{\"role\":\"user\",{}", &text[1..]);
            }
            if let Some(fast) = peek(&text) {
                prop_assert_eq!(fast, crate::body::peek_text(&text), "{}", text);
            }
            let list = format!("[{text}, {text}]");
            prop_assert_eq!(elements(&list), Some(vec![text.as_str(), text.as_str()]));
            let fast = peek(&text);
            prop_assert_eq!(
                peeked_elements(&list),
                Some(vec![(text.as_str(), fast.clone()), (text.as_str(), fast)])
            );
        }

        #[test]
        fn walks_never_panic_on_damaged_text(s in "[\\[\\]{}\",:\\\\ a-z0-9]{0,40}") {
            let _ = elements(&s);
            let _ = peek(&s);
        }
    }
}
