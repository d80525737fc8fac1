//! Call fingerprints: an exact key (tool + canonical arguments) and a fuzzy key (tool + primary
//! arguments, with shell normalization).
//!
//! Arguments are walked and fed straight into a [`StreamHasher`]; no canonical string is ever
//! built. Object members are hashed one by one and summed, so member order never matters (and
//! does not depend on how `serde_json` stores maps). Both keys are computed once per call event.

use globset::GlobMatcher;
use regex::Regex;
use serde_json::{Map, Value};

use crate::event::Arguments;
use crate::hash::{StreamHasher, combine, hash_str, tag};

/// Canonicalization settings, compiled once from the policy.
#[derive(Clone, Debug)]
pub struct FingerprintRules {
    pub(crate) volatile_keys: Vec<Box<str>>,
    pub(crate) primary_keys: Vec<Box<str>>,
    pub(crate) sort_keys: bool,
    pub(crate) collapse_whitespace: bool,
    pub(crate) path_separators: bool,
    pub(crate) case_insensitive_tools: bool,
    pub(crate) shell: ShellRules,
}

/// Shell normalization settings.
#[derive(Clone, Debug)]
pub struct ShellRules {
    pub(crate) tools: Vec<GlobMatcher>,
    pub(crate) command_keys: Vec<Box<str>>,
    pub(crate) file_read_commands: Vec<Box<str>>,
    pub(crate) file_operation_commands: Vec<Box<str>>,
    pub(crate) wait_commands: Vec<Box<str>>,
    pub(crate) complex_operators: Vec<Box<str>>,
}

/// What fingerprinting needs to know about one tool, decided once per tool name.
#[derive(Clone, Debug)]
pub struct ToolKeys {
    /// Hash of the (possibly case-folded) tool name.
    pub tool_hash: u64,
    pub primary: KeySet,
    /// Global plus per-tool volatile keys.
    pub volatile: KeySet,
    pub shell: bool,
    /// A plain file-reading tool (`read_file`, `view`, …): a call with only a path collapses to
    /// the same fuzzy key as `cat <path>`.
    pub read_tool: bool,
}

/// The keys of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallKeys {
    pub exact: u64,
    pub fuzzy: u64,
    /// A wait command (`sleep 30`): never counted by the repeat detectors.
    pub wait: bool,
    /// A shell command doing what file tools do (`cat`, `sed`, …).
    pub file_op: bool,
    /// A shell command matching the test-run patterns.
    pub test: bool,
    /// The fuzzy key is a file-read key.
    pub file_read: bool,
}

const READ_TOOLS: &[&str] = &[
    "read",
    "read_file",
    "view",
    "view_file",
    "open_file",
    "file_read",
];
const PATH_KEYS: &[&str] = &[
    "path",
    "file_path",
    "filepath",
    "file",
    "filename",
    "target_file",
    "absolute_path",
];
/// Flags of file-read commands that take a value (`head -n 20 f`).
const VALUE_FLAGS: &[&str] = &["-n", "-c", "--lines", "--bytes"];

fn contains(list: &[Box<str>], s: &str) -> bool {
    list.iter().any(|k| &**k == s)
}

/// A small set of argument keys, checked by hash first (one hash, then integer compares).
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    /// A two-bit Bloom filter over the key hashes: most non-members are rejected by it.
    bloom: u128,
    keys: Vec<(u64, Box<str>)>,
}

fn bloom_bits(h: u64) -> u128 {
    (1u128 << (h & 127)) | (1u128 << ((h >> 7) & 127))
}

impl KeySet {
    pub fn new<'s>(keys: impl IntoIterator<Item = &'s str>) -> KeySet {
        let mut set = KeySet::default();
        for k in keys {
            if !set.contains(k) {
                let h = hash_str(k);
                set.bloom |= bloom_bits(h);
                set.keys.push((h, k.into()));
            }
        }
        set
    }

    pub fn contains(&self, k: &str) -> bool {
        !self.keys.is_empty() && self.contains_hashed(hash_str(k), k)
    }

    fn contains_hashed(&self, h: u64, k: &str) -> bool {
        let bits = bloom_bits(h);
        self.bloom & bits == bits && self.keys.iter().any(|(x, s)| *x == h && &**s == k)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(_, s)| &**s)
    }
}

/// Whether `s` is already in collapsed form (ASCII, single inner spaces, no edge spaces).
fn collapsed(s: &str) -> bool {
    let b = s.as_bytes();
    if !s.is_ascii() {
        return false;
    }
    match (b.first(), b.last()) {
        (Some(f), Some(l)) if f.is_ascii_whitespace() || l.is_ascii_whitespace() => return false,
        _ => {}
    }
    let mut prev_space = false;
    for &c in b {
        if c.is_ascii_whitespace() {
            if c != b' ' || prev_space {
                return false;
            }
            prev_space = true;
        } else {
            prev_space = false;
        }
    }
    true
}

/// Whether an argument key holds a path.
pub fn is_path_key(k: &str) -> bool {
    matches!(
        k,
        "path" | "paths" | "file" | "files" | "filename" | "dir" | "directory" | "cwd" | "folder"
    ) || k.ends_with("path")
        || k.ends_with("paths")
        || k.ends_with("_file")
        || k.ends_with("_dir")
}

impl FingerprintRules {
    pub fn from_config(c: &loopguard_rules::Config) -> FingerprintRules {
        let boxed = |v: &[String]| v.iter().map(|s| s.as_str().into()).collect::<Vec<_>>();
        FingerprintRules {
            volatile_keys: boxed(&c.fingerprint.volatile_keys),
            primary_keys: boxed(&c.fingerprint.primary_keys),
            sort_keys: c.fingerprint.sort_keys,
            collapse_whitespace: c.fingerprint.collapse_whitespace,
            path_separators: c.fingerprint.path_separators,
            case_insensitive_tools: c.fingerprint.case_insensitive_tools,
            shell: ShellRules {
                tools: c.shell.tools.clone(),
                command_keys: boxed(&c.shell.command_keys),
                file_read_commands: boxed(&c.shell.file_read_commands),
                file_operation_commands: boxed(&c.shell.file_operation_commands),
                wait_commands: boxed(&c.shell.wait_commands),
                complex_operators: boxed(&c.shell.complex_operators),
            },
        }
    }

    /// Resolves the key lists of one tool (once per tool name).
    pub fn tool_keys(&self, c: &loopguard_rules::Config, tool: &str) -> ToolKeys {
        let folded;
        let name = if self.case_insensitive_tools {
            folded = tool.to_lowercase();
            folded.as_str()
        } else {
            tool
        };
        let per_tool = c.fingerprint.tools.get(tool).or_else(|| {
            c.fingerprint
                .tools
                .iter()
                .find(|(k, _)| self.case_insensitive_tools && k.eq_ignore_ascii_case(tool))
                .map(|(_, v)| v)
        });
        let primary = match per_tool.and_then(|t| t.primary_keys.as_ref()) {
            Some(p) => KeySet::new(p.iter().map(String::as_str)),
            None => KeySet::new(self.primary_keys.iter().map(|s| &**s)),
        };
        let volatile = KeySet::new(
            self.volatile_keys.iter().map(|s| &**s).chain(
                per_tool
                    .iter()
                    .flat_map(|t| t.volatile_keys.iter().map(String::as_str)),
            ),
        );
        let mut h = StreamHasher::new();
        h.bytes(name.as_bytes());
        ToolKeys {
            tool_hash: h.finish(),
            primary,
            volatile,
            shell: self.shell.tools.iter().any(|g| g.is_match(tool)),
            read_tool: READ_TOOLS.iter().any(|r| r.eq_ignore_ascii_case(tool)),
        }
    }

    /// Fingerprints one call. `test_commands` are the test-run patterns of the tool's category.
    pub fn keys(&self, tool: &ToolKeys, args: &Arguments<'_>, test_commands: &[Regex]) -> CallKeys {
        match args {
            Arguments::Json(v) => self.keys_of_value(tool, v, test_commands),
            Arguments::Raw(s) => match serde_json::from_str::<Value>(s) {
                Ok(v) => self.keys_of_value(tool, &v, test_commands),
                Err(_) => {
                    let mut h = StreamHasher::with_seed(tool.tool_hash);
                    h.byte(tag::RAW);
                    self.text(&mut h, s, false);
                    let exact = h.finish();
                    let mut keys = CallKeys {
                        exact,
                        fuzzy: exact,
                        ..CallKeys::default()
                    };
                    if tool.shell {
                        self.shell_keys(s, &mut keys, test_commands);
                    }
                    keys
                }
            },
        }
    }

    fn keys_of_value(&self, tool: &ToolKeys, v: &Value, test_commands: &[Regex]) -> CallKeys {
        let Value::Object(map) = v else {
            let mut h = StreamHasher::with_seed(tool.tool_hash);
            self.value(&mut h, v, None, &tool.volatile);
            let exact = h.finish();
            return CallKeys {
                exact,
                fuzzy: exact,
                ..CallKeys::default()
            };
        };
        // One pass over the top-level members feeds both keys: each member is hashed once.
        let mut exact_acc = 0u64;
        let mut fuzzy_acc = 0u64;
        let mut any_primary = false;
        for (k, x) in map {
            let kh = hash_str(k);
            if tool.volatile.contains_hashed(kh, k) {
                continue;
            }
            let mut sub = StreamHasher::new();
            sub.byte(tag::KEY);
            sub.bytes(k.as_bytes());
            sub.byte(tag::END);
            self.value(&mut sub, x, Some(k), &tool.volatile);
            let member = sub.finish();
            exact_acc = if self.sort_keys {
                exact_acc.wrapping_add(member)
            } else {
                combine(exact_acc, member)
            };
            if tool.primary.contains_hashed(kh, k) {
                any_primary = true;
                fuzzy_acc = fuzzy_acc.wrapping_add(member);
            }
        }
        let finish = |acc: u64| {
            let mut h = StreamHasher::with_seed(tool.tool_hash);
            h.byte(tag::OBJECT);
            h.u64(acc);
            h.byte(tag::END);
            h.finish()
        };
        let exact = finish(exact_acc);
        let mut keys = CallKeys {
            exact,
            fuzzy: exact,
            ..CallKeys::default()
        };
        if tool.shell
            && let Some(cmd) = self.command(map)
        {
            self.shell_keys(cmd, &mut keys, test_commands);
            return keys;
        }
        if tool.read_tool
            && let Some(path) = only_path(map, &tool.primary)
        {
            keys.fuzzy = self.file_read_key(path);
            keys.file_read = true;
            return keys;
        }
        if any_primary {
            keys.fuzzy = combine(finish(fuzzy_acc), 0x00f0_22e7);
        }
        keys
    }

    /// The command of a shell call: the first command key present holding a string.
    pub fn command<'v>(&self, map: &'v Map<String, Value>) -> Option<&'v str> {
        self.shell
            .command_keys
            .iter()
            .find_map(|k| map.get(&**k))
            .and_then(Value::as_str)
    }

    fn shell_keys(&self, cmd: &str, keys: &mut CallKeys, test_commands: &[Regex]) {
        let sh = &self.shell;
        let cmd = cmd.trim();
        keys.test = test_commands.iter().any(|r| r.is_match(cmd));
        let first = cmd
            .split_whitespace()
            .next()
            .map(|w| w.rsplit('/').next().unwrap_or(w))
            .unwrap_or("");
        keys.file_op = contains(&sh.file_operation_commands, first);
        let complex = sh.complex_operators.iter().any(|op| cmd.contains(&**op));
        if !complex {
            keys.wait = contains(&sh.wait_commands, first);
            if contains(&sh.file_read_commands, first)
                && let Some(path) = single_operand(cmd)
            {
                keys.fuzzy = self.file_read_key(path);
                keys.file_read = true;
                return;
            }
        }
        let mut h = StreamHasher::new();
        h.byte(tag::SHELL);
        self.text(&mut h, cmd, false);
        keys.fuzzy = h.finish();
    }

    /// The fuzzy key shared by every plain read of one file.
    pub fn file_read_key(&self, path: &str) -> u64 {
        let mut h = StreamHasher::new();
        h.byte(tag::FILE_READ);
        self.text(&mut h, path, true);
        h.finish()
    }

    fn value(&self, h: &mut StreamHasher, v: &Value, key: Option<&str>, volatile: &KeySet) {
        match v {
            Value::Null => h.byte(tag::NULL),
            Value::Bool(true) => h.byte(tag::TRUE),
            Value::Bool(false) => h.byte(tag::FALSE),
            Value::Number(n) => {
                h.byte(tag::NUMBER);
                if let Some(i) = n.as_i64() {
                    h.u64(i as u64);
                } else if let Some(u) = n.as_u64() {
                    h.u64(u);
                } else if let Some(f) = n.as_f64() {
                    if f.fract() == 0.0 && f.abs() < 9.0e15 {
                        h.u64(f as i64 as u64);
                    } else {
                        h.u64(f.to_bits());
                    }
                }
            }
            Value::String(s) => {
                h.byte(tag::STRING);
                self.text(h, s, key.is_some_and(is_path_key));
                h.byte(tag::END);
            }
            Value::Array(items) => {
                h.byte(tag::ARRAY);
                for x in items {
                    self.value(h, x, key, volatile);
                }
                h.byte(tag::END);
            }
            Value::Object(map) => {
                h.byte(tag::OBJECT);
                if self.sort_keys {
                    let mut acc = 0u64;
                    for (k, x) in map {
                        if volatile.contains(k) {
                            continue;
                        }
                        let mut sub = StreamHasher::new();
                        sub.byte(tag::KEY);
                        sub.bytes(k.as_bytes());
                        sub.byte(tag::END);
                        self.value(&mut sub, x, Some(k), volatile);
                        acc = acc.wrapping_add(sub.finish());
                    }
                    h.u64(acc);
                } else {
                    for (k, x) in map {
                        if volatile.contains(k) {
                            continue;
                        }
                        h.byte(tag::KEY);
                        h.bytes(k.as_bytes());
                        h.byte(tag::END);
                        self.value(h, x, Some(k), volatile);
                    }
                }
                h.byte(tag::END);
            }
        }
    }

    /// Feeds a string, canonicalized, into the hasher.
    fn text(&self, h: &mut StreamHasher, s: &str, path: bool) {
        if path && self.path_separators {
            let clean = !s.contains('\\')
                && !s.contains("//")
                && !s.starts_with("./")
                && (!self.collapse_whitespace || collapsed(s));
            if clean {
                h.bytes(s.as_bytes());
                return;
            }
            let mut t = if self.collapse_whitespace {
                s.trim()
            } else {
                s
            };
            while let Some(rest) = t.strip_prefix("./").or_else(|| t.strip_prefix(".\\")) {
                t = rest.trim_start_matches(['/', '\\']);
            }
            let mut prev_slash = false;
            let mut prev_space = false;
            for &b in t.as_bytes() {
                let b = if b == b'\\' { b'/' } else { b };
                if b == b'/' && prev_slash {
                    continue;
                }
                prev_slash = b == b'/';
                if self.collapse_whitespace && b.is_ascii_whitespace() {
                    if !prev_space {
                        h.byte(b' ');
                    }
                    prev_space = true;
                    continue;
                }
                prev_space = false;
                h.byte(b);
            }
        } else if !self.collapse_whitespace || collapsed(s) {
            h.bytes(s.as_bytes());
        } else {
            for (i, w) in s.split_whitespace().enumerate() {
                if i > 0 {
                    h.byte(b' ');
                }
                h.bytes(w.as_bytes());
            }
        }
    }
}

/// The path of a read-tool call whose only primary argument is the path.
fn only_path<'v>(map: &'v Map<String, Value>, primary: &KeySet) -> Option<&'v str> {
    let mut path = None;
    for (k, v) in map {
        if !primary.contains(k) {
            continue;
        }
        if PATH_KEYS.contains(&k.as_str()) && path.is_none() {
            path = v.as_str();
        } else if !v.is_null() {
            return None;
        }
    }
    path
}

/// The one non-flag operand of a simple command, if it has exactly one.
pub fn single_operand(cmd: &str) -> Option<&str> {
    let mut words = cmd.split_whitespace().skip(1);
    let mut operand = None;
    while let Some(w) = words.next() {
        if w.starts_with('-') && w.len() > 1 {
            if VALUE_FLAGS.contains(&w) {
                words.next();
            }
            continue;
        }
        if operand.is_some() {
            return None;
        }
        operand = Some(w);
    }
    operand.map(|w| w.trim_matches(['"', '\'']))
}

/// The file a call is about, for messages: the shell file-read operand or a path argument.
pub fn file_of(rules: &FingerprintRules, tool: &ToolKeys, args: &Arguments<'_>) -> String {
    let owned;
    let v = match args {
        Arguments::Json(v) => *v,
        Arguments::Raw(s) => match serde_json::from_str::<Value>(s) {
            Ok(v) => {
                owned = v;
                &owned
            }
            Err(_) => return String::new(),
        },
    };
    let Value::Object(map) = v else {
        return String::new();
    };
    if tool.shell
        && let Some(cmd) = rules.command(map)
    {
        return single_operand(cmd).unwrap_or("").to_owned();
    }
    map.iter()
        .find(|(k, v)| is_path_key(k) && v.is_string())
        .and_then(|(_, v)| v.as_str())
        .unwrap_or("")
        .to_owned()
}

/// A key derived from another key and a detector tag, so loop keys of different kinds differ.
pub fn tagged(key: u64, t: u64) -> u64 {
    combine(key, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn rules() -> &'static (loopguard_rules::Config, FingerprintRules) {
        static RULES: std::sync::OnceLock<(loopguard_rules::Config, FingerprintRules)> =
            std::sync::OnceLock::new();
        RULES.get_or_init(|| {
            let loaded = loopguard_rules::Policy::builtin_default();
            let c = loaded.policy.unwrap().resolve(None, None);
            let f = FingerprintRules::from_config(&c);
            (c, f)
        })
    }

    fn keys(tool: &str, v: &Value) -> CallKeys {
        let (c, f) = rules();
        let t = f.tool_keys(c, tool);
        f.keys(&t, &Arguments::Json(v), &c.detectors.test_fix.test_commands)
    }

    #[test]
    fn volatile_keys_and_order_are_ignored() {
        let a = keys(
            "grep",
            &json!({"pattern": "foo", "path": "src", "request_id": "r1"}),
        );
        let b = keys(
            "grep",
            &json!({"path": "src", "request_id": "r2", "pattern": "foo"}),
        );
        assert_eq!(a, b);
        let nested_a = keys("x", &json!({"q": {"a": 1, "trace_id": 5}}));
        let nested_b = keys("x", &json!({"q": {"a": 1, "trace_id": 6}}));
        assert_eq!(nested_a.exact, nested_b.exact);
    }

    #[test]
    fn paths_are_normalized() {
        let a = keys("read_file", &json!({"path": "./src\\main.rs"}));
        let b = keys("read_file", &json!({"path": "src//main.rs"}));
        assert_eq!(a.exact, b.exact);
        let c = keys("read_file", &json!({"path": "src/lib.rs"}));
        assert_ne!(a.exact, c.exact);
    }

    #[test]
    fn shell_file_reads_share_a_fuzzy_key() {
        let cat = keys("bash", &json!({"command": "cat src/main.rs"}));
        let head = keys("bash", &json!({"command": "head -n 20 ./src/main.rs"}));
        let tail = keys("bash", &json!({"command": "tail src/main.rs"}));
        let read = keys("read_file", &json!({"path": "src/main.rs"}));
        assert_ne!(cat.exact, head.exact);
        assert_eq!(cat.fuzzy, head.fuzzy);
        assert_eq!(cat.fuzzy, tail.fuzzy);
        assert_eq!(cat.fuzzy, read.fuzzy);
        assert!(cat.file_read && cat.file_op);
        let other = keys("bash", &json!({"command": "cat src/lib.rs"}));
        assert_ne!(cat.fuzzy, other.fuzzy);
        // Two operands, or a pipe, are not a single file read.
        let two = keys("bash", &json!({"command": "cat a b"}));
        assert!(!two.file_read);
        let piped = keys("bash", &json!({"command": "cat src/main.rs | grep x"}));
        assert!(!piped.file_read);
        // Paging a read tool is not a plain read.
        let paged = keys("read_file", &json!({"path": "src/main.rs", "offset": 100}));
        assert_ne!(paged.fuzzy, read.fuzzy);
    }

    #[test]
    fn wait_and_test_commands_are_recognized() {
        assert!(keys("bash", &json!({"command": "sleep 30"})).wait);
        assert!(!keys("bash", &json!({"command": "sleep 3; ls"})).wait);
        assert!(keys("bash", &json!({"command": "cargo test -p x"})).test);
        assert!(!keys("bash", &json!({"command": "cargo build"})).test);
    }

    #[test]
    fn raw_arguments() {
        let (c, f) = rules();
        let t = f.tool_keys(c, "grep");
        let j = f.keys(&t, &Arguments::Raw(r#"{"pattern":"a"}"#), &[]);
        let v = json!({"pattern": "a"});
        assert_eq!(j, f.keys(&t, &Arguments::Json(&v), &[]));
        let x = f.keys(&t, &Arguments::Raw("not  json"), &[]);
        let y = f.keys(&t, &Arguments::Raw(" not json "), &[]);
        assert_eq!(x, y);
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|i| json!(i)),
            "[a-z ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn respace(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(format!("  {}\t", s.replace(' ', "  \n "))),
            Value::Array(a) => Value::Array(a.iter().map(respace).collect()),
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, x)| (k.clone(), respace(x))).collect())
            }
            other => other.clone(),
        }
    }

    proptest! {
        /// Raw arguments of any shape fingerprint without panicking, for any tool kind.
        #[test]
        fn raw_arguments_never_panic(s in "[ -~\\\\é€]{0,60}") {
            let (c, f) = rules();
            for tool in ["bash", "read_file", "x"] {
                let t = f.tool_keys(c, tool);
                let _ = f.keys(&t, &Arguments::Raw(&s), &c.detectors.test_fix.test_commands);
                let wrapped = format!("{{\"command\": {:?}, \"path\": {:?}}}", s, s);
                let _ = f.keys(&t, &Arguments::Raw(&wrapped), &c.detectors.test_fix.test_commands);
            }
        }

        #[test]
        fn key_order_never_matters(entries in prop::collection::vec(("[a-z]{1,6}", arb_json()), 0..6)) {
            let (c, f) = rules();
            let t = f.tool_keys(c, "tool");
            let mut dedup = std::collections::BTreeMap::new();
            for (k, v) in entries { dedup.insert(k, v); }
            // Build the object in two insertion orders.
            let fwd: Map<String, Value> = dedup.clone().into_iter().collect();
            let rev: Map<String, Value> = dedup.into_iter().rev().collect();
            let (a, b) = (Value::Object(fwd), Value::Object(rev));
            prop_assert_eq!(f.keys(&t, &Arguments::Json(&a), &[]), f.keys(&t, &Arguments::Json(&b), &[]));
        }

        #[test]
        fn whitespace_never_matters(v in arb_json()) {
            let (c, f) = rules();
            let t = f.tool_keys(c, "tool");
            let w = respace(&v);
            prop_assert_eq!(f.keys(&t, &Arguments::Json(&v), &[]), f.keys(&t, &Arguments::Json(&w), &[]));
        }

        #[test]
        fn volatile_keys_never_matter(v in arb_json(), id in any::<u64>(), ts in "[0-9:]{1,10}") {
            let (c, f) = rules();
            let t = f.tool_keys(c, "tool");
            let base = json!({"query": v.clone()});
            let noisy = json!({"query": v, "request_id": id, "timestamp": ts});
            prop_assert_eq!(f.keys(&t, &Arguments::Json(&base), &[]), f.keys(&t, &Arguments::Json(&noisy), &[]));
        }

        #[test]
        fn primary_changes_always_matter(a in "[a-z0-9/]{1,20}", b in "[a-z0-9/]{1,20}", other in arb_json()) {
            prop_assume!(a != b);
            let (c, f) = rules();
            let t = f.tool_keys(c, "search");
            let x = json!({"query": a, "extra": other.clone()});
            let y = json!({"query": b, "extra": other});
            let kx = f.keys(&t, &Arguments::Json(&x), &[]);
            let ky = f.keys(&t, &Arguments::Json(&y), &[]);
            prop_assert_ne!(kx.exact, ky.exact);
            prop_assert_ne!(kx.fuzzy, ky.fuzzy);
        }
    }
}
