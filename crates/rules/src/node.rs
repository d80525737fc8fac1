//! A YAML document as a tree of spanned nodes.
//!
//! Policies are first read into this loose form, so that every later check — unknown keys,
//! wrong types, semantic rules — can point at the exact place in the source and all of them can
//! be reported together instead of stopping at the first.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// Identifies one loaded source file inside a [`crate::SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SourceId(pub u32);

/// Where a node sits in its source: byte range plus 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    /// The file, in the [`crate::SourceMap`] of the load.
    pub source: SourceId,
    /// Start, in bytes from the beginning of the file.
    pub offset: usize,
    /// Length in bytes; 0 for a point (a missing key is reported at its parent).
    pub len: usize,
    /// 1-based line of `offset`.
    pub line: u32,
    /// 1-based column of `offset`, in characters.
    pub column: u32,
}

/// One YAML node and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    pub value: Value,
    pub span: Span,
}

/// The value of a node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in source order; keys are nodes so that they keep their own spans.
    Map(Vec<(Node, Node)>),
}

impl Value {
    /// A short name of the YAML type, as used in "expected X, found Y" messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

impl Node {
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub(crate) fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The value under `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The entry (key node, value node) under `key`.
    pub fn entry(&self, key: &str) -> Option<(&Node, &Node)> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(k, v)| (k, v))
    }

    /// Follows a dotted path of mapping keys.
    pub fn path(&self, path: &str) -> Option<&Node> {
        path.split('.').try_fold(self, |node, key| node.get(key))
    }

    /// Sets every span in the tree to belong to `source`.
    pub(crate) fn set_source(&mut self, source: SourceId) {
        self.span.source = source;
        match &mut self.value {
            Value::Seq(items) => items.iter_mut().for_each(|n| n.set_source(source)),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.set_source(source);
                v.set_source(source);
            }),
            _ => {}
        }
    }

    /// Deep-merges `over` into `self`: mappings merge key by key, anything else is replaced.
    pub fn merge(&mut self, over: &Node) {
        match (&mut self.value, &over.value) {
            (Value::Map(base), Value::Map(upper)) => {
                for (uk, uv) in upper {
                    match base.iter_mut().find(|(bk, _)| bk.value == uk.value) {
                        Some((_, bv)) => bv.merge(uv),
                        None => base.push((uk.clone(), uv.clone())),
                    }
                }
            }
            _ => *self = over.clone(),
        }
    }

    /// Converts to a JSON value (spans dropped).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.scalar_text(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The text of a scalar node (for keys that are not strings).
    pub(crate) fn scalar_text(&self) -> String {
        match &self.value {
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Str(s) => s.clone(),
            Value::Seq(_) => "[…]".into(),
            Value::Map(_) => "{…}".into(),
        }
    }
}

fn span_of(loc: &serde_saphyr::Location) -> Span {
    let span = loc.span();
    Span {
        source: SourceId(0),
        offset: usize::try_from(span.byte_offset().unwrap_or(0)).unwrap_or(usize::MAX),
        len: usize::try_from(span.byte_len().unwrap_or(0)).unwrap_or(0),
        line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
        column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
    }
}

impl From<Spanned<Value>> for Node {
    fn from(s: Spanned<Value>) -> Self {
        Node {
            span: span_of(&s.referenced),
            value: s.value,
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Value>>()? {
            items.push(Node::from(item));
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Value>>()? {
            let value = map.next_value::<Spanned<Value>>()?;
            entries.push((Node::from(key), Node::from(value)));
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_keep_line_and_column() {
        let doc: Spanned<Value> =
            serde_saphyr::from_str("a: 1\nb:\n  c: [x, \"y\"]\n").expect("parse");
        let root = Node::from(doc);
        let c = root.path("b.c").expect("b.c");
        assert_eq!((c.span.line, c.span.column), (3, 6));
        let y = &c.as_seq().expect("seq")[1];
        assert_eq!(y.as_str(), Some("y"));
        assert_eq!((y.span.line, y.span.column), (3, 10));
        let (bk, _) = root.entry("b").expect("b");
        assert_eq!((bk.span.line, bk.span.column), (2, 1));
        assert_eq!(root.get("a").map(|n| &n.value), Some(&Value::Int(1)));
    }

    #[test]
    fn merge_is_deep_for_mappings_and_replaces_lists() {
        let parse = |t: &str| crate::policy::parse_yaml(t, SourceId(0)).expect("parse");
        let mut base = parse("a: {x: 1, y: 2}\nl: [1, 2]\n");
        base.merge(&parse("a: {y: 3}\nl: [9]\n"));
        assert_eq!(
            base.to_json(),
            serde_json::json!({"a": {"x": 1, "y": 3}, "l": [9]})
        );
    }
}
