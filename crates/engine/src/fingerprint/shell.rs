//! Shell normalization: what a shell command reads, modifies, waits for or tests, and the
//! fuzzy key of a file read however it is spelled (`cat f`, `head f`, `read_file f`).

use super::*;

/// Recent answers of the test-run patterns (regexes, the most expensive thing a call event
/// runs) for one shell tool's commands, shared by every session. Each slot holds a 63-bit tag
/// of a command's hash and the answer in its low bit; a slot is overwritten by the next
/// command that maps to it, so the memo stays small and never needs a lock.
#[derive(Debug, Default)]
pub(super) struct TestMemo {
    slots: Box<[AtomicU64]>,
}

/// Slots of a shell tool's [`TestMemo`].
pub(super) const TEST_MEMO_SLOTS: usize = 64;

impl Clone for TestMemo {
    fn clone(&self) -> TestMemo {
        TestMemo::new(self.slots.len())
    }
}

impl TestMemo {
    pub(super) fn new(slots: usize) -> TestMemo {
        TestMemo {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether a (trimmed) command matches one of the patterns. The memo is keyed by the
    /// command's bytes and by which pattern list is asked (the engine always asks a tool with
    /// the same list: its category's).
    pub(super) fn is_test(&self, cmd: &str, patterns: &[Regex]) -> bool {
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

/// Flags of file-read commands that take a value (`head -n 20 f`).
pub(super) const VALUE_FLAGS: &[&str] = &["-n", "-c", "--lines", "--bytes"];

pub(super) fn contains(list: &[Box<str>], s: &str) -> bool {
    list.iter().any(|k| &**k == s)
}

/// The script of an argument vector that runs a shell (`["bash", "-lc", "cargo test"]`).
pub(super) fn shell_script(v: &Value) -> Option<&str> {
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

/// Whether a command writes to a file with `>` or `>>` (not to `/dev/…`, not `>&`, not an
/// arrow such as `->`, `=>` or `<>`).
pub(super) fn writes_to_file(b: &[u8]) -> bool {
    let mut i = 0;
    while let Some(off) = b.get(i..).and_then(|rest| memchr::memchr(b'>', rest)) {
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
    false
}

/// The bytes that end a command segment (`\n`, `;`, `|`, `&`, `(`).
const SEGMENT_ENDS: [bool; 256] = {
    let mut t = [false; 256];
    t[b'\n' as usize] = true;
    t[b';' as usize] = true;
    t[b'|' as usize] = true;
    t[b'&' as usize] = true;
    t[b'(' as usize] = true;
    t
};

/// The words of an ASCII command segment: its runs of bytes other than ASCII whitespace
/// (what `split_whitespace` gives for ASCII text).
#[derive(Clone, Copy)]
struct AsciiWords<'s> {
    rest: &'s [u8],
}

impl<'s> Iterator for AsciiWords<'s> {
    type Item = &'s [u8];

    #[inline]
    fn next(&mut self) -> Option<&'s [u8]> {
        let is_space = |c: &u8| matches!(c, b'\t'..=b'\r' | b' ');
        let start = self.rest.iter().position(|c| !is_space(c))?;
        let word = self.rest.get(start..)?;
        let len = word.iter().position(is_space).unwrap_or(word.len());
        let (word, rest) = word.split_at(len);
        self.rest = rest;
        Some(word)
    }
}

impl FingerprintRules {
    /// The command of a shell call: the first command key present holding a string.
    pub fn command<'v>(&self, map: &'v Map<String, Value>) -> Option<&'v str> {
        self.shell
            .command_keys
            .iter()
            .find_map(|k| map.get(&**k))
            .and_then(Value::as_str)
    }

    /// Whether a command contains a complex operator (one pass over its bytes).
    pub(super) fn complex(&self, cmd: &str) -> bool {
        let sh = &self.shell;
        if sh.empty_operator {
            return true;
        }
        let b = cmd.as_bytes();
        let mut from = 0;
        while let Some(at) = b.get(from..).and_then(|rest| {
            rest.iter()
                .position(|&c| sh.operator_starts[usize::from(c)])
        }) {
            let i = from + at;
            let rest = b.get(i..).unwrap_or_default();
            if sh
                .complex_operators
                .iter()
                .any(|op| rest.starts_with(op.as_bytes()))
            {
                return true;
            }
            from = i + 1;
        }
        false
    }

    /// Shell normalization of one command. `text` is the command's text hash when the member
    /// pass already computed it (for the untrimmed command).
    pub(super) fn shell_keys(
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

    /// Whether a shell command changes files or the environment: one of its commands (the
    /// first word of the command line or after `&&`, `||`, `;`, `|`, a newline or `(`, past
    /// `sudo` and `VAR=value` words) is in `shell.modify_commands`, or it writes to a file
    /// with `>` / `>>` (not `/dev/…`, not `>&`).
    pub(super) fn modifies(&self, cmd: &str) -> bool {
        let list = &self.shell.modify_commands;
        let b = cmd.as_bytes();
        if writes_to_file(b) {
            return true;
        }
        if list.is_empty() {
            return false;
        }
        // The command's segments between separators (ASCII bytes, so each segment is whole
        // characters), each split into words: at ASCII whitespace when the segment is ASCII
        // (the whitespace `split_whitespace` knows there), else by `split_whitespace`.
        let mut from = 0;
        loop {
            let rest = b.get(from..).unwrap_or_default();
            let end = rest
                .iter()
                .position(|&c| SEGMENT_ENDS[usize::from(c)])
                .map_or(b.len(), |p| from + p);
            let segment = b.get(from..end).unwrap_or_default();
            let hit = if segment.is_ascii() {
                self.segment_modifies(AsciiWords { rest: segment })
            } else {
                cmd.get(from..end).is_some_and(|segment| {
                    self.segment_modifies(segment.split_whitespace().map(str::as_bytes))
                })
            };
            if hit {
                return true;
            }
            if end >= b.len() {
                return false;
            }
            from = end + 1;
        }
    }

    /// Whether one command segment, given as its words, runs a modify command: its first word
    /// past `sudo` and `VAR=value` words, with any directory dropped, is one of
    /// `shell.modify_commands` (with its second word or flag when that has one).
    fn segment_modifies<'w>(&self, words: impl Iterator<Item = &'w [u8]> + Clone) -> bool {
        let mut words =
            words.skip_while(|w| *w == b"sudo" || (w.contains(&b'=') && !w.starts_with(b"-")));
        let Some(first) = words.next() else {
            return false;
        };
        let first = first.rsplit(|&c| c == b'/').next().unwrap_or(first);
        let Some(seconds) = self
            .shell
            .modify_first_words
            .position_of_bytes(first)
            .and_then(|i| self.shell.modify_seconds.get(i))
        else {
            return false;
        };
        let next = words.clone().next();
        seconds.iter().any(|second| match second.as_deref() {
            None => true,
            Some(flag) if flag.starts_with('-') => words
                .clone()
                .take(8)
                .any(|r| r.starts_with(flag.as_bytes())),
            Some(sub) => next == Some(sub.as_bytes()),
        })
    }
}
