//! Python literals as `repr` writes them (`{'id': 'call_1', 'arguments': {'q': 'x'}}`), read
//! into JSON values: smolagents records the calls of a step as the `repr` of a list of dicts.
//!
//! Dicts, lists, tuples, strings (single, double or triple quoted, with escapes and an
//! optional `r`/`b`/`u` prefix), integers, floats, `True`, `False` and `None`. Nesting is
//! bounded by [`MAX_DEPTH`]; anything else is no literal (`None`), never a panic.

use serde_json::{Map, Value};

/// Deepest nesting read.
const MAX_DEPTH: usize = 64;

/// Reads `text` (surrounding whitespace allowed) as one Python literal.
pub(crate) fn parse(text: &str) -> Option<Value> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        text,
    };
    let v = p.value(0)?;
    p.ws();
    (p.i == p.s.len()).then_some(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match *self.s.get(self.i)? {
            b'{' => {
                self.i += 1;
                let mut map = Map::new();
                loop {
                    if self.eat(b'}') {
                        return Some(Value::Object(map));
                    }
                    let key = match self.value(depth + 1)? {
                        Value::String(k) => k,
                        other => other.to_string(),
                    };
                    if !self.eat(b':') {
                        return None;
                    }
                    let v = self.value(depth + 1)?;
                    map.insert(key, v);
                    if !self.eat(b',') {
                        return self.eat(b'}').then_some(Value::Object(map));
                    }
                }
            }
            open @ (b'[' | b'(') => {
                self.i += 1;
                let close = if open == b'[' { b']' } else { b')' };
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        return Some(Value::Array(items));
                    }
                    items.push(self.value(depth + 1)?);
                    if !self.eat(b',') {
                        return self.eat(close).then_some(Value::Array(items));
                    }
                }
            }
            b'\'' | b'"' => self.string(),
            b'r' | b'b' | b'u' | b'R' | b'B' | b'U'
                if matches!(self.s.get(self.i + 1), Some(b'\'' | b'"')) =>
            {
                let raw = matches!(self.s[self.i], b'r' | b'R');
                self.i += 1;
                if raw {
                    self.raw_string()
                } else {
                    self.string()
                }
            }
            _ => self.word(),
        }
    }

    /// The quote at `self.i` and whether it is tripled; moves past the opening quotes.
    fn open_quote(&mut self) -> (u8, bool) {
        let q = self.s[self.i];
        let triple = self.s.get(self.i + 1) == Some(&q) && self.s.get(self.i + 2) == Some(&q);
        self.i += if triple { 3 } else { 1 };
        (q, triple)
    }

    fn closes(&self, q: u8, triple: bool) -> bool {
        self.s.get(self.i) == Some(&q)
            && (!triple
                || (self.s.get(self.i + 1) == Some(&q) && self.s.get(self.i + 2) == Some(&q)))
    }

    fn raw_string(&mut self) -> Option<Value> {
        let (q, triple) = self.open_quote();
        let from = self.i;
        while self.i < self.s.len() && !self.closes(q, triple) {
            self.i += if self.s[self.i] == b'\\' { 2 } else { 1 };
        }
        let body = self.text.get(from..self.i.min(self.s.len()))?.to_owned();
        (self.i < self.s.len()).then_some(())?;
        self.i += if triple { 3 } else { 1 };
        Some(Value::String(body))
    }

    fn string(&mut self) -> Option<Value> {
        let (q, triple) = self.open_quote();
        let mut out = String::new();
        let mut from = self.i;
        loop {
            if self.i >= self.s.len() {
                return None;
            }
            if self.closes(q, triple) {
                out.push_str(self.text.get(from..self.i)?);
                self.i += if triple { 3 } else { 1 };
                return Some(Value::String(out));
            }
            if self.s[self.i] != b'\\' {
                self.i += 1;
                continue;
            }
            out.push_str(self.text.get(from..self.i)?);
            let e = *self.s.get(self.i + 1)?;
            self.i += 2;
            match e {
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'0' => out.push('\0'),
                b'\\' | b'\'' | b'"' => out.push(char::from(e)),
                b'\n' => {}
                b'x' | b'u' | b'U' => {
                    let n = match e {
                        b'x' => 2,
                        b'u' => 4,
                        _ => 8,
                    };
                    let hex = self.text.get(self.i..self.i + n)?;
                    let c = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)?;
                    out.push(c);
                    self.i += n;
                }
                _ => {
                    // Python keeps an unknown escape as written.
                    out.push('\\');
                    self.i -= 1;
                }
            }
            from = self.i;
        }
    }

    fn word(&mut self) -> Option<Value> {
        let from = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric()
                || matches!(self.s[self.i], b'.' | b'-' | b'+' | b'_'))
        {
            self.i += 1;
        }
        let w = self.text.get(from..self.i)?;
        match w {
            "True" => Some(Value::Bool(true)),
            "False" => Some(Value::Bool(false)),
            "None" => Some(Value::Null),
            _ => {
                if let Ok(n) = w.parse::<i64>() {
                    return Some(Value::from(n));
                }
                let f = w.parse::<f64>().ok()?;
                serde_json::Number::from_f64(f).map(Value::Number)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::parse;

    #[test]
    fn reprs_of_calls_read_as_json() {
        assert_eq!(
            parse(
                "[{'id': 'call_1', 'type': 'function', 'function': {'name': 'web_search', 'arguments': {'query': \"rust's borrow\", 'n': 3, 'x': None, 'ok': True}}}]"
            ),
            Some(
                json!([{"id": "call_1", "type": "function", "function": {"name": "web_search", "arguments": {"query": "rust's borrow", "n": 3, "x": null, "ok": true}}}])
            )
        );
        assert_eq!(
            parse(
                "{'code': 'print(\\'a\\')\\nx = 1\\t# \\u00e9', 'f': 1.5, 't': (1, 2), 'r': r'\\d+'}"
            ),
            Some(json!({"code": "print('a')\nx = 1\t# é", "f": 1.5, "t": [1, 2], "r": "\\d+"}))
        );
        assert_eq!(parse("'''a 'b' c'''"), Some(json!("a 'b' c")));
    }

    #[test]
    fn what_is_no_literal_is_none() {
        for t in [
            "",
            "[",
            "{'a'}",
            "{'a': }",
            "'open",
            "[1 2]",
            "foo",
            "{'a': 1} x",
            "'\\x4'",
            "r'",
            "(((",
            "'\\",
            "é",
            "'é\\",
        ] {
            assert_eq!(parse(t), None, "{t:?}");
        }
        assert_eq!(parse(&"[".repeat(10_000)), None);
    }
}
