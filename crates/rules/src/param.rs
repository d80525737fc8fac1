//! Reading the checked node tree into typed values: what the declarations of [`crate::schema`]
//! generate their readers from.
//!
//! Each declared section becomes a [`Section`]: its schema rows and a reader that builds the
//! section's Rust type field by field, each field under the key its declaration names. A value
//! that is absent (in an entry of a map or list, where declared defaults are not merged) takes
//! its declared default; a value of the wrong kind cannot reach here (the checks refuse it) and
//! takes the default too, never a made-up zero.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::check::NameGlob;
use regex::Regex;

use crate::check::{compile_glob, compile_regex};
use crate::node::{Node, Span, Value};
use crate::schema::{Field, Kind};

/// A declared section: its schema rows, and the reader of its Rust type.
#[derive(Debug)]
pub(crate) struct Section<T: 'static> {
    /// The section's keys, in declaration order.
    pub fields: &'static [Field],
    /// Builds the section's value from a (checked) mapping; `None` only when a required value
    /// is missing or unreadable.
    pub read: fn(&Node) -> Option<T>,
}

/// A type a declared value is read into.
pub(crate) trait Param: Sized {
    /// The value of a present node; `None` when the node is not a value of this type (a null
    /// scalar, say), and the declared default applies instead.
    fn read(node: &Node) -> Option<Self>;

    /// The value of a key that is absent and has no declared default.
    fn absent() -> Option<Self> {
        None
    }
}

/// Reads the value under `key` of a section, else the section's declared default for it.
pub(crate) fn field<T: Param>(node: &Node, defaults: &Node, key: &str) -> Option<T> {
    node.get(key)
        .and_then(T::read)
        .or_else(|| defaults.get(key).and_then(T::read))
        .or_else(T::absent)
}

/// The defaults declared for a section's own keys, as a mapping, built once per section and
/// kept in `cell`. Nested sections are not in it: their readers apply their own defaults.
pub(crate) fn defaults_in(
    cell: &'static OnceLock<Node>,
    fields: &'static [Field],
) -> &'static Node {
    cell.get_or_init(|| {
        let entries = fields
            .iter()
            .filter_map(|f| Some((name(f.key), crate::policy::parse_default(f.default?))))
            .collect();
        Node {
            value: Value::Map(entries),
            span: Span::default(),
        }
    })
}

fn name(key: &str) -> Node {
    Node {
        value: Value::Str(key.to_owned()),
        span: Span::default(),
    }
}

/// Every declared default of a section, as a node tree.
pub(crate) fn section_defaults(fields: &'static [Field]) -> Node {
    let mut entries = Vec::new();
    for field in fields {
        let value = match (&field.kind, field.default) {
            (_, Some(yaml)) => crate::policy::parse_default(yaml),
            (Kind::Section(inner), None) => section_defaults(inner),
            _ => continue,
        };
        entries.push((name(field.key), value));
    }
    Node {
        value: Value::Map(entries),
        span: Span::default(),
    }
}

/// A declared key from the field name it is written as (`r#match` is the key `match`).
pub(crate) const fn key_of(ident: &'static str) -> &'static str {
    match ident.as_bytes() {
        [b'r', b'#', rest @ ..] => match std::str::from_utf8(rest) {
            Ok(key) => key,
            Err(_) => ident,
        },
        _ => ident,
    }
}

/// The null node: what an absent section is read from.
pub(crate) fn null() -> &'static Node {
    static NULL: Node = Node {
        value: Value::Null,
        span: Span {
            source: crate::node::SourceId(0),
            offset: 0,
            len: 0,
            line: 0,
            column: 0,
        },
    };
    &NULL
}

/// A value with the place it was written.
#[derive(Clone, Debug)]
pub(crate) struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

/// The entries of a mapping, in the order they were written (categories: the first matching
/// pattern wins).
#[derive(Clone, Debug, Default)]
pub(crate) struct Ordered<T>(pub Vec<(String, T)>);

impl Param for bool {
    fn read(node: &Node) -> Option<Self> {
        match node.value {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// Integers: a YAML integer that fits the type.
macro_rules! integer {
    ($($ty:ty),*) => {$(
        impl Param for $ty {
            fn read(node: &Node) -> Option<Self> {
                match node.value {
                    Value::Int(i) => <$ty>::try_from(i).ok(),
                    _ => None,
                }
            }
        }
    )*};
}

integer!(u32, u64, usize);

impl Param for String {
    fn read(node: &Node) -> Option<Self> {
        node.as_str().map(str::to_owned)
    }
}

impl Param for Regex {
    fn read(node: &Node) -> Option<Self> {
        compile_regex(node.as_str()?).ok()
    }
}

impl Param for NameGlob {
    fn read(node: &Node) -> Option<Self> {
        compile_glob(node.as_str()?).ok()
    }
}

/// The node itself, for what is merged or read later (a category's detector parameters, a
/// plugin's configuration).
impl Param for Node {
    fn read(node: &Node) -> Option<Self> {
        Some(node.clone())
    }

    fn absent() -> Option<Self> {
        Some(null().clone())
    }
}

/// `None` for null or absent.
impl<T: Param> Param for Option<T> {
    fn read(node: &Node) -> Option<Self> {
        match node.value {
            Value::Null => Some(None),
            _ => T::read(node).map(Some),
        }
    }

    fn absent() -> Option<Self> {
        Some(None)
    }
}

/// Empty for null or absent; items that are not values of `T` are left out.
impl<T: Param> Param for Vec<T> {
    fn read(node: &Node) -> Option<Self> {
        match &node.value {
            Value::Seq(items) => Some(items.iter().filter_map(T::read).collect()),
            Value::Null => Some(Vec::new()),
            _ => None,
        }
    }

    fn absent() -> Option<Self> {
        Some(Vec::new())
    }
}

/// Entries of a mapping; empty for null or absent.
fn entries<T: Param>(node: &Node) -> Option<Vec<(String, T)>> {
    match &node.value {
        Value::Map(entries) => Some(
            entries
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), T::read(v)?)))
                .collect(),
        ),
        Value::Null => Some(Vec::new()),
        _ => None,
    }
}

impl<T: Param> Param for BTreeMap<String, T> {
    fn read(node: &Node) -> Option<Self> {
        entries(node).map(|e| e.into_iter().collect())
    }

    fn absent() -> Option<Self> {
        Some(BTreeMap::new())
    }
}

impl<T: Param> Param for Ordered<T> {
    fn read(node: &Node) -> Option<Self> {
        entries(node).map(Ordered)
    }

    fn absent() -> Option<Self> {
        Some(Ordered(Vec::new()))
    }
}

impl<T: Param> Param for Spanned<T> {
    fn read(node: &Node) -> Option<Self> {
        Some(Spanned {
            value: T::read(node)?,
            span: node.span,
        })
    }
}
