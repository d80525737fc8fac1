//! Call fingerprints: an exact key (tool + canonical arguments) and a fuzzy key (tool + primary
//! arguments, with shell normalization).
//!
//! No canonical form of the arguments is ever built. Each string is hashed once, as it is, when
//! it is already canonical (the common case, checked a word at a time), else after its
//! canonical form is written to a reused per-thread buffer; a structure's hash is mixed from
//! the hashes of its parts. Object members are hashed one by one and summed, so member order
//! never matters (and does not depend on how `serde_json` stores maps). One pass over the
//! top-level members feeds the exact key, the fuzzy key, the shell command and the read-tool
//! path, so each member (and each key) is hashed once per call event.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use globset::GlobMatcher;
use regex::Regex;
use serde_json::{Map, Number, Value};

use crate::event::Arguments;
use crate::hash::{combine, hash_bytes, mix, tag};

mod raw;

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
    /// `shell.modify_commands`, each as its first word and an optional second word or flag.
    pub(crate) modify_commands: Vec<(Box<str>, Option<Box<str>>)>,
    pub(crate) complex_operators: Vec<Box<str>>,
    /// The first bytes of the complex operators (bit `b % 64` of word `b / 64`).
    pub(crate) operator_starts: [u64; 4],
    /// An empty complex operator: every command is complex.
    pub(crate) empty_operator: bool,
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
    /// Every key with a role for this tool (primary, volatile, shell command), so that each
    /// argument key is looked up once; `role[i]` is the role of the i-th key of `roles`.
    roles: KeySet,
    role: Vec<Role>,
    /// Shell tools: the test-run patterns' recent answers.
    tests: TestMemo,
}

/// Recent answers of the test-run patterns (regexes, the most expensive thing a call event
/// runs) for one shell tool's commands, shared by every session. Each slot holds a 63-bit tag
/// of a command's hash and the answer in its low bit; a slot is overwritten by the next
/// command that maps to it, so the memo stays small and never needs a lock.
#[derive(Debug, Default)]
struct TestMemo {
    slots: Box<[AtomicU64]>,
}

/// Slots of a shell tool's [`TestMemo`].
const TEST_MEMO_SLOTS: usize = 64;

impl Clone for TestMemo {
    fn clone(&self) -> TestMemo {
        TestMemo::new(self.slots.len())
    }
}

impl TestMemo {
    fn new(slots: usize) -> TestMemo {
        TestMemo {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether a (trimmed) command matches one of the patterns. The memo is keyed by the
    /// command's bytes and by which pattern list is asked (the engine always asks a tool with
    /// the same list: its category's).
    fn is_test(&self, cmd: &str, patterns: &[Regex]) -> bool {
        let run = || patterns.iter().any(|r| r.is_match(cmd));
        if patterns.is_empty() || self.slots.is_empty() {
            return run();
        }
        let list = mix(patterns.as_ptr() as usize as u64, patterns.len() as u64);
        // Never 0, the empty slot.
        let tag = (hash_bytes(list, cmd.as_bytes()) | 2) & !1;
        let Some(slot) = self.slots.get((tag >> 40) as usize % self.slots.len()) else {
            return run();
        };
        let seen = slot.load(Ordering::Relaxed);
        if seen & !1 == tag {
            return seen & 1 == 1;
        }
        let found = run();
        slot.store(tag | u64::from(found), Ordering::Relaxed);
        found
    }
}

/// What an argument key means for one tool.
#[derive(Clone, Copy, Debug, Default)]
struct Role {
    primary: bool,
    volatile: bool,
    /// Its position among the shell's command keys (shell tools only).
    command: Option<usize>,
}

impl ToolKeys {
    /// The role of an argument key (hashed with `key_hash`).
    #[inline]
    fn role(&self, h: u64, k: &str) -> Role {
        self.roles
            .position_hashed(h, k)
            .and_then(|i| self.role.get(i))
            .copied()
            .unwrap_or_default()
    }
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
    /// A shell command that changes files or the environment (`shell.modify_commands`, or a
    /// write with `>`).
    pub modify: bool,
    /// The arguments ask an editing tool only to look (`"command": "view"`): such a call
    /// changes nothing.
    pub read_only: bool,
}

/// Whether a top-level argument asks an editing tool only to look (`command: view`,
/// `action: read`, …).
fn looks_read_only_member(k: &str, v: &str) -> bool {
    matches!(k, "command" | "action" | "mode" | "operation")
        && ["view", "read", "list", "show", "get", "cat", "open"]
            .iter()
            .any(|w| v.eq_ignore_ascii_case(w))
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
/// Mixed into the fuzzy key of a call with primary arguments.
const FUZZY_TAG: u64 = 0x00f0_22e7;
/// Seeds the ordered member chain of objects when keys are not sorted.
const ORDERED: u64 = 0x6f72_6465_7265_6421;
/// Seeds tool-name hashes.
const TOOL: u64 = 0x746f_6f6c_6e61_6d65;
/// Scratch buffers larger than this are not kept.
const SCRATCH_KEEP: usize = 1 << 16;

thread_local! {
    /// Where non-canonical strings are canonicalized before hashing.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn contains(list: &[Box<str>], s: &str) -> bool {
    list.iter().any(|k| &**k == s)
}

/// Hash of an argument key, as used by [`KeySet`] and the member hashes.
#[inline]
fn key_hash(k: &str) -> u64 {
    hash_bytes(tag::KEY, k.as_bytes())
}

/// A small set of argument keys, found by hash in a small open-addressing table (at most a
/// quarter full, so most probes end at once), each hit confirmed against the key's bytes kept
/// beside its hash.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    /// The keys, in the order they were first given.
    keys: Vec<Box<str>>,
    entries: Vec<Entry>,
    /// 1 + an index into `keys` and `entries`, 0 for an empty slot; a power-of-two length.
    slots: Box<[u16]>,
}

/// A key's hash, and its bytes when it is short (most are), in one place.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u64,
    /// Length of a key of at most 16 bytes; `u8::MAX` for a longer one.
    len: u8,
    bytes: [u8; 16],
}

impl KeySet {
    pub fn new<'s>(keys: impl IntoIterator<Item = &'s str>) -> KeySet {
        let mut list: Vec<Box<str>> = Vec::new();
        for k in keys {
            if list.len() < usize::from(u16::MAX / 4) && !list.iter().any(|x| &**x == k) {
                list.push(k.into());
            }
        }
        let entries: Vec<Entry> = list
            .iter()
            .map(|k| {
                let mut bytes = [0u8; 16];
                let len = match bytes.get_mut(..k.len()) {
                    Some(b) => {
                        b.copy_from_slice(k.as_bytes());
                        k.len() as u8
                    }
                    None => u8::MAX,
                };
                Entry {
                    hash: key_hash(k),
                    len,
                    bytes,
                }
            })
            .collect();
        let size = (4 * list.len()).next_power_of_two().max(8);
        let mut slots = vec![0u16; size].into_boxed_slice();
        for (i, e) in entries.iter().enumerate() {
            let mut j = slot_of(e.hash, size);
            while slots[j] != 0 {
                j = (j + 1) & (size - 1);
            }
            slots[j] = i as u16 + 1;
        }
        KeySet {
            keys: list,
            entries,
            slots,
        }
    }

    pub fn contains(&self, k: &str) -> bool {
        !self.keys.is_empty() && self.position_hashed(key_hash(k), k).is_some()
    }

    /// The position of a key (hashed with `key_hash`) among the set's keys.
    #[inline(always)]
    fn position_hashed(&self, h: u64, k: &str) -> Option<usize> {
        let size = self.slots.len();
        let mut j = slot_of(h, size);
        // The table is at most a quarter full: an empty slot ends every probe sequence.
        for _ in 0..size {
            let i = usize::from(*self.slots.get(j)?).checked_sub(1)?;
            if let Some(e) = self.entries.get(i)
                && e.hash == h
                && match e.bytes.get(..usize::from(e.len)) {
                    Some(short) => same_key(short, k.as_bytes()),
                    None => self.keys.get(i).is_some_and(|x| **x == *k),
                }
            {
                return Some(i);
            }
            j = (j + 1) & (size - 1);
        }
        None
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|s| &**s)
    }
}

/// The first table slot of a key hash.
#[inline]
fn slot_of(h: u64, size: usize) -> usize {
    (h >> 32) as usize & (size - 1)
}

/// `a == b` for argument keys, which are short: compared in one or two overlapping word loads
/// rather than through a `memcmp` call.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], i: usize| {
        s.get(i..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map(|c| u64::from_le_bytes(*c))
    };
    let half = |s: &[u8], i: usize| {
        s.get(i..)
            .and_then(<[u8]>::first_chunk::<4>)
            .map(|c| u32::from_le_bytes(*c))
    };
    match n {
        0..4 => a == b,
        4..8 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that equals `b` (exact).
#[inline]
fn eq_bytes(w: u64, b: u8) -> u64 {
    let x = w ^ (LO * u64::from(b));
    !(((x & !HI).wrapping_add(!HI)) | x) & HI
}

/// A word-at-a-time check that `s` is already in canonical form: printable ASCII with single
/// inner spaces and none at the ends; for a path also no `\`, no `//` and no leading `./`.
/// Never true for a string that is not canonical; may be false for some that are (control
/// characters), which the exact checks then decide.
pub(crate) fn plain(s: &[u8], path: bool) -> bool {
    let (Some(&first), Some(&last)) = (s.first(), s.last()) else {
        return true;
    };
    if first == b' ' || last == b' ' || (path && s.starts_with(b"./")) {
        return false;
    }
    // Per word: the flags of what is never plain, and the spaces and slashes (high bits).
    let check = |w: u64| {
        // Control characters and non-ASCII bytes.
        let mut bad = (w.wrapping_sub(LO * 0x20) & !w & HI) | (w & HI);
        let sp = eq_bytes(w, b' ');
        bad |= sp & (sp >> 8);
        let sl = if path {
            let sl = eq_bytes(w, b'/');
            bad |= eq_bytes(w, b'\\') | (sl & (sl >> 8));
            sl
        } else {
            0
        };
        (bad, sp, sl)
    };
    let n = s.len();
    if n < 8 {
        let mut w = [b'a'; 8];
        if let Some(head) = w.get_mut(..n) {
            head.copy_from_slice(s);
        }
        return check(u64::from_le_bytes(w)).0 == 0;
    }
    let mut bad = 0u64;
    // The previous word's last byte was a space (or a slash): bit 0.
    let (mut carry_space, mut carry_slash) = (0u64, 0u64);
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let (x, sp, sl) = check(u64::from_le_bytes(b));
        bad |= x | (carry_space & (sp >> 7)) | (carry_slash & (sl >> 7));
        carry_space = sp >> 63;
        carry_slash = sl >> 63;
    }
    // The last 8 bytes, overlapping the words above: every pair of neighbours not yet checked
    // lies inside it.
    if !chunks.remainder().is_empty()
        && let Some(tail) = s.get(n - 8..).and_then(<[u8]>::first_chunk::<8>)
    {
        bad |= check(u64::from_le_bytes(*tail)).0;
    }
    bad == 0
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

/// The canonical 64 bits of a JSON number: integers (and integral floats) by value, so `1` and
/// `1.0` are one number.
fn number_bits(n: &Number) -> u64 {
    if let Some(i) = n.as_i64() {
        i as u64
    } else if let Some(u) = n.as_u64() {
        u
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            f as i64 as u64
        } else {
            f.to_bits()
        }
    } else {
        0
    }
}

/// Runs `f` on the cleared per-thread scratch buffer.
fn with_scratch<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let out = f(&mut buf);
            if buf.capacity() > SCRATCH_KEEP {
                *buf = Vec::new();
            }
            out
        }
        Err(_) => f(&mut Vec::new()),
    })
}

/// What the member pass found out about a shell call's command.
#[derive(Clone, Copy)]
struct CommandMember<'v> {
    /// Position of its key in `command_keys`.
    pos: usize,
    value: &'v Value,
    /// The text hash of the value, when it was computed as a non-path string.
    text: Option<u64>,
}

impl FingerprintRules {
    pub fn from_config(c: &loopguard_rules::Config) -> FingerprintRules {
        let boxed = |v: &[String]| v.iter().map(|s| s.as_str().into()).collect::<Vec<_>>();
        let mut operator_starts = [0u64; 4];
        for op in &c.shell.complex_operators {
            if let Some(&b) = op.as_bytes().first() {
                operator_starts[usize::from(b >> 6)] |= 1 << (b & 63);
            }
        }
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
                modify_commands: c
                    .shell
                    .modify_commands
                    .iter()
                    .filter_map(|m| {
                        let mut w = m.split_whitespace();
                        let first = w.next()?;
                        Some((first.into(), w.next().map(Into::into)))
                    })
                    .collect(),
                complex_operators: boxed(&c.shell.complex_operators),
                operator_starts,
                empty_operator: c.shell.complex_operators.iter().any(String::is_empty),
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
        let shell = self.shell.tools.iter().any(|g| g.is_match(name));
        let command_keys: &[Box<str>] = if shell { &self.shell.command_keys } else { &[] };
        let roles = KeySet::new(
            primary
                .iter()
                .chain(volatile.iter())
                .chain(command_keys.iter().map(|k| &**k)),
        );
        let role = roles
            .iter()
            .map(|k| Role {
                primary: primary.contains(k),
                volatile: volatile.contains(k),
                command: command_keys.iter().position(|c| &**c == k),
            })
            .collect();
        ToolKeys {
            tool_hash: hash_bytes(TOOL, name.as_bytes()),
            primary,
            volatile,
            shell,
            read_tool: READ_TOOLS.iter().any(|r| r.eq_ignore_ascii_case(tool)),
            roles,
            role,
            tests: if shell {
                TestMemo::new(TEST_MEMO_SLOTS)
            } else {
                TestMemo::default()
            },
        }
    }

    /// Fingerprints one call. `test_commands` are the test-run patterns of the tool's category.
    pub fn keys(&self, tool: &ToolKeys, args: &Arguments<'_>, test_commands: &[Regex]) -> CallKeys {
        match args {
            Arguments::Json(v) => self.keys_of_value(tool, v, test_commands),
            Arguments::Raw(s) => match self.keys_of_raw(tool, s, test_commands) {
                Some(keys) => keys,
                None => self.keys_of_parsed_text(tool, s, test_commands),
            },
        }
    }

    /// The keys of raw arguments the scanner left to the parser.
    #[cold]
    fn keys_of_parsed_text(&self, tool: &ToolKeys, s: &str, test_commands: &[Regex]) -> CallKeys {
        match serde_json::from_str::<Value>(s) {
            Ok(v) => self.keys_of_value(tool, &v, test_commands),
            Err(_) => {
                let text = self.text_hash(s, false);
                let exact = mix(tool.tool_hash, mix(tag::RAW, text));
                let mut keys = CallKeys {
                    exact,
                    fuzzy: exact,
                    ..CallKeys::default()
                };
                if tool.shell {
                    self.shell_keys(tool, s, Some(text), &mut keys, test_commands);
                }
                keys
            }
        }
    }

    fn keys_of_value(&self, tool: &ToolKeys, v: &Value, test_commands: &[Regex]) -> CallKeys {
        let Value::Object(map) = v else {
            let exact = mix(tool.tool_hash, self.value_hash(v, false, tool));
            return CallKeys {
                exact,
                fuzzy: exact,
                ..CallKeys::default()
            };
        };
        // One pass over the top-level members feeds both keys, finds the shell command and the
        // read tool's lone path: each member (and each key) is hashed once.
        let mut exact_acc = if self.sort_keys { 0 } else { ORDERED };
        let mut fuzzy_acc = 0u64;
        let mut any_primary = false;
        let mut command: Option<CommandMember<'_>> = None;
        // The path of a read-tool call whose only primary argument is the path.
        let mut only_path = tool.read_tool;
        let mut path: Option<&str> = None;
        let mut read_only = false;
        for (k, x) in map {
            let kh = key_hash(k);
            if let Value::String(s) = x
                && looks_read_only_member(k, s)
            {
                read_only = true;
            }
            let role = tool.role(kh, k);
            let is_command = match role.command {
                Some(pos) if command.is_none_or(|c| pos < c.pos) => {
                    command = Some(CommandMember {
                        pos,
                        value: x,
                        text: None,
                    });
                    true
                }
                _ => false,
            };
            let primary = role.primary;
            if only_path && primary {
                if path.is_none() && PATH_KEYS.contains(&k.as_str()) {
                    path = x.as_str();
                } else if !x.is_null() {
                    only_path = false;
                }
            }
            if role.volatile {
                continue;
            }
            let value = match x {
                Value::String(s) => {
                    let path_key = is_path_key(k);
                    let text = self.text_hash(s, path_key);
                    if is_command
                        && !path_key
                        && let Some(c) = &mut command
                    {
                        c.text = Some(text);
                    }
                    mix(tag::STRING, text)
                }
                Value::Array(_) => self.value_hash(x, is_path_key(k), tool),
                _ => self.value_hash(x, false, tool),
            };
            let member = mix(kh, value);
            exact_acc = if self.sort_keys {
                exact_acc.wrapping_add(member)
            } else {
                mix(exact_acc, member)
            };
            if primary {
                any_primary = true;
                fuzzy_acc = fuzzy_acc.wrapping_add(member);
            }
        }
        let finish = |acc: u64| mix(tool.tool_hash, mix(tag::OBJECT, acc));
        let exact = finish(exact_acc);
        let mut keys = CallKeys {
            exact,
            fuzzy: exact,
            read_only,
            ..CallKeys::default()
        };
        if let Some(c) = command
            && let Some(cmd) = c.value.as_str()
        {
            self.shell_keys(tool, cmd, c.text, &mut keys, test_commands);
            return keys;
        }
        // A command as an argument vector running a shell script (`["bash", "-lc", "…"]`, as
        // Codex sends it): the script is the command. The keys stay the vector's.
        if let Some(c) = command
            && let Some(script) = shell_script(c.value)
        {
            keys.test = tool.tests.is_test(script.trim(), test_commands);
            keys.modify = self.modifies(script);
            return keys;
        }
        if only_path && let Some(path) = path {
            keys.fuzzy = self.file_read_key(path);
            keys.file_read = true;
            return keys;
        }
        if any_primary {
            keys.fuzzy = combine(finish(fuzzy_acc), FUZZY_TAG);
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

    /// Whether a command contains a complex operator (one pass over its bytes).
    fn complex(&self, cmd: &str) -> bool {
        let sh = &self.shell;
        if sh.empty_operator {
            return true;
        }
        let b = cmd.as_bytes();
        (0..b.len()).any(|i| {
            let c = b[i];
            sh.operator_starts[usize::from(c >> 6)] & (1 << (c & 63)) != 0
                && sh
                    .complex_operators
                    .iter()
                    .any(|op| b[i..].starts_with(op.as_bytes()))
        })
    }

    /// Shell normalization of one command. `text` is the command's text hash when the member
    /// pass already computed it (for the untrimmed command).
    fn shell_keys(
        &self,
        tool: &ToolKeys,
        cmd: &str,
        text: Option<u64>,
        keys: &mut CallKeys,
        test_commands: &[Regex],
    ) {
        let sh = &self.shell;
        let untrimmed = cmd.len();
        let cmd = cmd.trim();
        keys.test = tool.tests.is_test(cmd, test_commands);
        keys.modify = self.modifies(cmd);
        let first = cmd
            .split_whitespace()
            .next()
            .map(|w| w.rsplit('/').next().unwrap_or(w))
            .unwrap_or("");
        keys.file_op = contains(&sh.file_operation_commands, first);
        if !self.complex(cmd) {
            keys.wait = contains(&sh.wait_commands, first);
            if contains(&sh.file_read_commands, first)
                && let Some(path) = single_operand(cmd)
            {
                keys.fuzzy = self.file_read_key(path);
                keys.file_read = true;
                return;
            }
        }
        // Collapsing whitespace trims; otherwise the hash is reusable only if nothing was trimmed.
        let text = text
            .filter(|_| self.collapse_whitespace || cmd.len() == untrimmed)
            .unwrap_or_else(|| self.text_hash(cmd, false));
        keys.fuzzy = mix(tag::SHELL, text);
    }

    /// The fuzzy key shared by every plain read of one file.
    pub fn file_read_key(&self, path: &str) -> u64 {
        mix(tag::FILE_READ, self.text_hash(path, true))
    }

    fn value_hash(&self, v: &Value, path: bool, tool: &ToolKeys) -> u64 {
        match v {
            Value::Null => tag::NULL,
            Value::Bool(true) => tag::TRUE,
            Value::Bool(false) => tag::FALSE,
            Value::Number(n) => mix(tag::NUMBER, number_bits(n)),
            Value::String(s) => mix(tag::STRING, self.text_hash(s, path)),
            Value::Array(items) => {
                let mut h = tag::ARRAY;
                for x in items {
                    h = mix(h, self.value_hash(x, path, tool));
                }
                mix(h, items.len() as u64)
            }
            Value::Object(map) => {
                let mut acc = if self.sort_keys { 0 } else { ORDERED };
                for (k, x) in map {
                    let kh = key_hash(k);
                    if tool.role(kh, k).volatile {
                        continue;
                    }
                    let member = mix(kh, self.value_hash(x, is_path_key(k), tool));
                    acc = if self.sort_keys {
                        acc.wrapping_add(member)
                    } else {
                        mix(acc, member)
                    };
                }
                mix(tag::OBJECT, acc)
            }
        }
    }

    /// The hash of a string's canonical form: whitespace collapsed (when the policy says so),
    /// and for a path, separators normalized. Canonical strings are hashed as they are.
    fn text_hash(&self, s: &str, path: bool) -> u64 {
        if s.starts_with("http")
            && let Some(q) = s.find('?')
            && s[..q].contains("://")
        {
            return self.url_hash(s, q);
        }
        let path = path && self.path_separators;
        let canonical = if self.collapse_whitespace {
            plain(s.as_bytes(), path) || (collapsed(s) && (!path || clean_path(s)))
        } else {
            !path || clean_path(s)
        };
        if canonical {
            return hash_bytes(tag::TEXT, s.as_bytes());
        }
        with_scratch(|buf| {
            if path {
                self.canonical_path(s, buf);
            } else {
                for (i, w) in s.split_whitespace().enumerate() {
                    if i > 0 {
                        buf.push(b' ');
                    }
                    buf.extend_from_slice(w.as_bytes());
                }
            }
            hash_bytes(tag::TEXT, buf)
        })
    }

    /// The hash of a URL without its volatile query parameters (`?_ts=…`, `&request_id=…`,
    /// any parameter named by `volatile_keys` or starting with `_`): a cache-busting parameter
    /// does not make a new request. `q` is the position of the `?`.
    fn url_hash(&self, s: &str, q: usize) -> u64 {
        with_scratch(|buf| {
            buf.extend_from_slice(s[..q].trim().as_bytes());
            let (query, fragment) = match s[q + 1..].split_once('#') {
                Some((a, b)) => (a, Some(b)),
                None => (&s[q + 1..], None),
            };
            let mut first = true;
            for param in query.split('&').filter(|p| !p.is_empty()) {
                let name = param.split_once('=').map_or(param, |(n, _)| n);
                if name.starts_with('_') || self.volatile_keys.iter().any(|k| **k == *name) {
                    continue;
                }
                buf.push(if first { b'?' } else { b'&' });
                first = false;
                buf.extend_from_slice(param.trim().as_bytes());
            }
            if let Some(f) = fragment {
                buf.push(b'#');
                buf.extend_from_slice(f.as_bytes());
            }
            hash_bytes(tag::TEXT, buf)
        })
    }

    /// Writes a path's canonical form: `\` as `/`, no doubled separators, no leading `./`,
    /// whitespace collapsed when the policy says so.
    fn canonical_path(&self, s: &str, out: &mut Vec<u8>) {
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
                    out.push(b' ');
                }
                prev_space = true;
                continue;
            }
            prev_space = false;
            out.push(b);
        }
    }
}

/// The script of an argument vector that runs a shell (`["bash", "-lc", "cargo test"]`).
fn shell_script(v: &Value) -> Option<&str> {
    let items = v.as_array()?;
    let [shell, flag, script] = items.as_slice() else {
        return None;
    };
    let shell = shell.as_str()?;
    let shell = shell.rsplit('/').next().unwrap_or(shell);
    let flag = flag.as_str()?;
    (matches!(shell, "bash" | "sh" | "zsh" | "dash") && flag.starts_with('-') && flag.contains('c'))
        .then(|| script.as_str())
        .flatten()
}

impl FingerprintRules {
    /// Whether a shell command changes files or the environment: one of its commands (the
    /// first word of the command line or after `&&`, `||`, `;`, `|`, a newline or `(`, past
    /// `sudo` and `VAR=value` words) is in `shell.modify_commands`, or it writes to a file
    /// with `>` / `>>` (not `/dev/…`, not `>&`).
    fn modifies(&self, cmd: &str) -> bool {
        let list = &self.shell.modify_commands;
        let b = cmd.as_bytes();
        // Writes with `>`.
        let mut i = 0;
        while let Some(off) = b[i..].iter().position(|&c| c == b'>') {
            let at = i + off;
            let mut j = at + 1;
            if b.get(j) == Some(&b'>') {
                j += 1;
            }
            let quoted_arrow = at > 0 && matches!(b[at - 1], b'-' | b'=' | b'<');
            if b.get(j) != Some(&b'&') && !quoted_arrow {
                while b.get(j) == Some(&b' ') {
                    j += 1;
                }
                let target = &b[j..];
                if !target.is_empty()
                    && !target.starts_with(b"/dev/")
                    && !target.starts_with(b"&")
                    && !target[0].is_ascii_whitespace()
                {
                    return true;
                }
            }
            i = j.max(at + 1);
        }
        if list.is_empty() {
            return false;
        }
        cmd.split(['\n', ';', '|', '&', '(']).any(|segment| {
            let mut words = segment
                .split_whitespace()
                .skip_while(|w| *w == "sudo" || (w.contains('=') && !w.starts_with('-')));
            let Some(first) = words.next() else {
                return false;
            };
            let first = first.rsplit('/').next().unwrap_or(first);
            list.iter().any(|(w, second)| {
                **w == *first
                    && match second.as_deref() {
                        None => true,
                        Some(flag) if flag.starts_with('-') => {
                            words.clone().take(8).any(|r| r.starts_with(flag))
                        }
                        Some(sub) => words.clone().next() == Some(sub),
                    }
            })
        })
    }
}

/// A path with nothing for [`FingerprintRules::canonical_path`] to change (whitespace aside).
fn clean_path(s: &str) -> bool {
    !s.contains('\\') && !s.contains("//") && !s.starts_with("./")
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

    /// Codex edits with `apply_patch` run by its shell tool, as an argument vector: the tests
    /// it re-ran after each patch looked like the same failing call again.
    #[test]
    fn shell_commands_that_change_files_are_recognized() {
        let modifies = |cmd: &str| keys("bash", &json!({ "command": cmd })).modify;
        for cmd in [
            "apply_patch <<'EOF'\n*** Begin Patch\nEOF",
            "cd /repo && git apply fix.diff",
            "sed -i 's/a/b/' src/lib.rs",
            "cat > notes.md <<EOF\nhi\nEOF",
            "echo x >> log.txt",
            "sudo pip install requests",
            "FOO=1 npm install left-pad",
        ] {
            assert!(modifies(cmd), "{cmd}");
        }
        for cmd in [
            "cargo test 2>&1 | tail",
            "ls -la > /dev/null",
            "git status",
            "grep -n 'x => y' src/a.rs",
            "sed 's/a/b/' src/lib.rs",
            "pip list",
        ] {
            assert!(!modifies(cmd), "{cmd}");
        }
        let codex = |script: &str| keys("shell", &json!({"command": ["bash", "-lc", script]}));
        assert!(codex("apply_patch <<'EOF'\nx\nEOF").modify);
        assert!(codex("cargo test").test);
        assert!(!codex("cargo test").modify);
    }

    /// A cache-busting query parameter made every poll of one URL a new call.
    #[test]
    fn volatile_url_parameters_do_not_make_a_new_call() {
        let url = |u: &str| keys("http_request", &json!({"method": "GET", "url": u}));
        let a = url("https://x.io/api/jobs/77?_ts=1718704873&view=full");
        let b = url("https://x.io/api/jobs/77?_ts=1718704914&view=full");
        let c = url("https://x.io/api/jobs/77?view=full&request_id=9");
        assert_eq!(a.exact, b.exact);
        assert_eq!(a.exact, c.exact);
        assert_eq!(a.fuzzy, b.fuzzy);
        assert_ne!(a.exact, url("https://x.io/api/jobs/77?view=summary").exact);
        assert_ne!(a.exact, url("https://x.io/api/jobs/78?_ts=1").exact);
    }

    #[test]
    fn wait_and_test_commands_are_recognized() {
        assert!(keys("bash", &json!({"command": "sleep 30"})).wait);
        assert!(!keys("bash", &json!({"command": "sleep 3; ls"})).wait);
        assert!(keys("bash", &json!({"command": "cargo test -p x"})).test);
        assert!(!keys("bash", &json!({"command": "cargo build"})).test);
    }

    #[test]
    fn remembered_test_answers_match_the_patterns() {
        let (c, f) = rules();
        let t = f.tool_keys(c, "bash");
        let tests = &c.detectors.test_fix.test_commands;
        let other = [Regex::new("^make").unwrap()];
        let cmds = (0..300).map(|i| match i % 4 {
            0 => format!("cargo test -p crate_{}", i % 37),
            1 => format!("make target_{}", i % 41),
            2 => format!("pytest tests/test_{}.py", i % 13),
            _ => format!("ls dir_{}", i % 7),
        });
        for cmd in cmds {
            for patterns in [&tests[..], &other[..], &[]] {
                let expected = patterns.iter().any(|r| r.is_match(&cmd));
                assert_eq!(t.tests.is_test(&cmd, patterns), expected, "{cmd}");
            }
        }
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

    /// Keys with every role: primary, path, command, volatile, read-only, and none.
    const ARB_KEYS: &[&str] = &[
        "path",
        "file",
        "file_path",
        "filename",
        "command",
        "cmd",
        "script",
        "input",
        "pattern",
        "query",
        "url",
        "offset",
        "request_id",
        "id",
        "action",
        "mode",
        "x",
        "cwd",
        "nested_dir",
    ];

    /// Strings that exercise canonical forms, escapes, URLs, paths and shell commands.
    fn arb_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,12}",
            "[ -~]{0,24}",
            "[\\\\/\"\t\n\r\u{0}-\u{1f}a é€😀]{0,16}",
            Just("view".to_owned()),
            Just("https://h/x?_ts=1&a=2#f".to_owned()),
            Just(".//src\\\\a.rs ".to_owned()),
            Just("cat   src/a.rs".to_owned()),
            Just("cargo test -p x && echo > out".to_owned()),
        ]
    }

    /// Numbers of every shape `serde_json` reads differently.
    fn arb_number() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            any::<f32>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            Just("-0".to_owned()),
            Just("1.0".to_owned()),
            Just("1E2".to_owned()),
            Just("12345678901234567890123".to_owned()),
            Just("-9223372036854775809".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just("1e400".to_owned()),
        ]
    }

    /// JSON text, written as a model might write it: any member order, duplicate keys,
    /// whitespace, `\u` escapes, and numbers in every form.
    fn arb_json_text() -> impl Strategy<Value = String> {
        let string = (arb_text(), any::<bool>()).prop_map(|(s, ascii)| {
            if ascii {
                // Every non-ASCII character (and `/`) as a `\u` escape.
                let mut out = String::from("\"");
                for ch in s.chars() {
                    match ch {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '/' => out.push_str("\\/"),
                        c if (c as u32) < 0x20 || !c.is_ascii() => {
                            let mut units = [0u16; 2];
                            for u in c.encode_utf16(&mut units) {
                                out.push_str(&format!("\\u{u:04X}"));
                            }
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
                out
            } else {
                serde_json::to_string(&s).unwrap()
            }
        });
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            arb_number(),
            string,
        ];
        let ws = prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r\n")];
        let value = leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec((inner.clone(), ws.clone()), 0..4).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", body.join(","))
                }),
                prop::collection::vec((prop::sample::select(ARB_KEYS), inner, ws.clone()), 0..5)
                    .prop_map(|members| {
                        let body: Vec<String> = members
                            .into_iter()
                            .map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}"))
                            .collect();
                        format!("{{{}}}", body.join(","))
                    }),
            ]
        });
        // Arguments are mostly objects: make the top level one most of the time.
        prop_oneof![
            3 => prop::collection::vec((prop::sample::select(ARB_KEYS), value.clone()), 0..7)
                .prop_map(|members| {
                    let body: Vec<String> =
                        members.into_iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                    format!("{{{}}}", body.join(", "))
                }),
            1 => value,
        ]
    }

    /// The keys of raw text through the parser only, as before the scanner.
    fn parsed_keys(f: &FingerprintRules, t: &ToolKeys, s: &str, tests: &[Regex]) -> CallKeys {
        f.keys_of_parsed_text(t, s, tests)
    }

    const ARB_TOOLS: &[&str] = &["bash", "read_file", "str_replace_editor", "grep", "x"];

    #[test]
    fn raw_scan_handles_what_it_should() {
        // The common shapes are scanned, not parsed: the scanner answers for them.
        let (c, f) = rules();
        let t = f.tool_keys(c, "bash");
        let tests = &c.detectors.test_fix.test_commands;
        for s in [
            r#"{"command": "ls -la \"my dir\"\n", "timeout": 30}"#,
            r#"{"path": "src/a.rs", "offset": 10, "limit": 2.5e1, "flags": [true, null]}"#,
            r#"{"q": "caf\u00e9 \ud83d\ude00", "nested": {"a": {"b": [1, -2, 0.5]}}}"#,
        ] {
            assert!(f.keys_of_raw(&t, s, tests).is_some(), "{s}");
        }
        // What it leaves to the parser.
        for s in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"\u0061": 1}"#,
            r#"{"command": ["bash", "-lc", "ls"]}"#,
            r#"{"a": "\ud800"}"#,
            "{\"a\": \"tab\there\"}",
            r#"{"a": 01}"#,
            r#"{"a": 1} x"#,
            "not json",
            "",
        ] {
            assert!(f.keys_of_raw(&t, s, tests).is_none(), "{s}");
        }
    }

    proptest! {
        /// Raw arguments give the keys the parsed path gives, for any JSON text, for every
        /// kind of tool.
        #[test]
        fn raw_and_parsed_arguments_give_the_same_keys(s in arb_json_text()) {
            let (c, f) = rules();
            let tests = &c.detectors.test_fix.test_commands;
            for tool in ARB_TOOLS {
                let t = f.tool_keys(c, tool);
                let raw = f.keys(&t, &Arguments::Raw(&s), tests);
                prop_assert_eq!(raw, parsed_keys(f, &t, &s, tests), "tool {} text {}", tool, s);
                if let Ok(v) = serde_json::from_str::<Value>(&s) {
                    prop_assert_eq!(raw, f.keys(&t, &Arguments::Json(&v), tests));
                }
            }
        }

        /// The same for text that is mostly not JSON: JSON text with bytes dropped, doubled
        /// or inserted.
        #[test]
        fn raw_and_parsed_agree_on_damaged_text(
            s in arb_json_text(),
            cuts in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(&["", "\"", "\\", ",", "}", "]", "{", "\\u", "0", " ", "\u{1}", "e"][..])), 1..4),
        ) {
            let mut s = s;
            for (at, ins) in cuts {
                let mut i = at.index(s.len() + 1);
                while !s.is_char_boundary(i) {
                    i -= 1;
                }
                if ins.is_empty() && i < s.len() {
                    let mut j = i + 1;
                    while !s.is_char_boundary(j) {
                        j += 1;
                    }
                    s.replace_range(i..j, "");
                } else {
                    s.insert_str(i, ins);
                }
            }
            let (c, f) = rules();
            let tests = &c.detectors.test_fix.test_commands;
            for tool in ARB_TOOLS {
                let t = f.tool_keys(c, tool);
                prop_assert_eq!(
                    f.keys(&t, &Arguments::Raw(&s), tests),
                    parsed_keys(f, &t, &s, tests),
                    "tool {} text {}", tool, s
                );
            }
        }

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

        /// The word-at-a-time check agrees with the byte-at-a-time definitions.
        #[test]
        fn plain_strings_are_exactly_the_canonical_printable_ones(
            s in prop_oneof!["[ -~\\t\\né/\\\\.]{0,40}", "[ a./\\\\\\t\\x7fé]{0,24}"],
            path in any::<bool>(),
        ) {
            let expected = s.bytes().all(|b| (0x20..=0x7f).contains(&b))
                && collapsed(&s)
                && (!path || clean_path(&s));
            prop_assert_eq!(plain(s.as_bytes(), path), expected, "{:?}", s);
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
