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

/// What a script writes files with (Python, Node, Ruby), as it appears in its text.
const SCRIPT_WRITES: [&[u8]; 14] = [
    b".write(",
    b"write_text(",
    b"write_bytes(",
    b"writeFileSync(",
    b"appendFileSync(",
    b"writeFile(",
    b"os.remove(",
    b"os.unlink(",
    b".unlink(",
    b"os.rename(",
    b"os.replace(",
    b"shutil.",
    b"File.write(",
    b"FileUtils.",
];

/// Whether a command line runs an interpreter (`python`, `python3.11`, `node`, `ruby`, …, as
/// the first word of one of its commands) on a script that writes files: an edit made with
/// `python - <<'EOF' … open(p, 'w').write(s)` is an edit. Writing to the standard streams
/// (`sys.stdout.write(`) is not.
pub(super) fn script_writes(cmd: &str) -> bool {
    let b = cmd.as_bytes();
    // A script that writes calls something, and most command lines run no interpreter: both
    // are settled before any marker is looked for.
    if memchr::memchr(b'(', b).is_none() {
        return false;
    }
    let interpreted = Segments::new(cmd).any(|segment| {
        segment
            .split_whitespace()
            .find(|w| !w.contains('='))
            .map(|w| w.rsplit('/').next().unwrap_or(w))
            .is_some_and(|w| {
                let name = w.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
                matches!(
                    name,
                    "python" | "node" | "ruby" | "perl" | "deno" | "bun" | "php"
                )
            })
    });
    interpreted && code_writes(cmd)
}

/// Whether a script's text writes files (see [`SCRIPT_WRITES`]); writing to the standard
/// streams (`sys.stdout.write(`) is not. Also read for a code-running tool's `code` argument.
pub(crate) fn code_writes(code: &str) -> bool {
    let b = code.as_bytes();
    memchr::memchr(b'(', b).is_some()
        && SCRIPT_WRITES.iter().any(|m| {
            memchr::memmem::find_iter(b, m).any(|at| {
                let before = &b[..at];
                !(before.ends_with(b"stdout") || before.ends_with(b"stderr"))
            })
        })
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
        keys.typed = super::Typed::of(cmd);
        keys.test = tool.tests.is_test(cmd, test_commands);
        keys.modify = self.modifies(cmd);
        if keys.modify {
            keys.writes = super::writes::shell_writes(cmd, |s| self.modifies(s));
        }
        keys.query = !keys.modify && self.queries(cmd);
        let first = cmd
            .split_whitespace()
            .next()
            .map(|w| w.rsplit('/').next().unwrap_or(w))
            .unwrap_or("");
        keys.file_op = contains(&sh.file_operation_commands, first);
        if noop(cmd) {
            // Every command line that does nothing is one fuzzy call: `true`, `echo done`,
            // `echo 'Final done'` again and again is the same idleness in other words.
            keys.fuzzy = u64::from(NOOP_FUZZY);
            return;
        }
        if self.complex(cmd) {
            keys.poll = self.polls(cmd);
        } else {
            // Typing nothing into a terminal (a terminal agent's empty batch of keystrokes) waits,
            // then shows the screen.
            keys.wait = contains(&sh.wait_commands, first) || cmd.is_empty();
            if contains(&sh.file_read_commands, first)
                && let Some(path) = single_operand(cmd)
            {
                keys.fuzzy = self.file_read_key(path);
                keys.file_read = true;
                return;
            }
        }
        // Collapsing whitespace trims; otherwise the hash is reusable only if nothing was trimmed.
        // With whitespace collapsed, spaces around the operators joining commands are no part
        // of the command line either: `cd repo && git status` is `cd repo&&git status`.
        let text = if self.collapse_whitespace
            && memchr::memchr3(b'&', b'|', b';', cmd.as_bytes()).is_some()
        {
            operators_tight_hash(cmd)
        } else {
            text.filter(|_| self.collapse_whitespace || cmd.len() == untrimmed)
                .unwrap_or_else(|| self.text_hash(cmd, false))
        };
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
    /// Saving what a state query prints (`git diff > patch.txt`) changes nothing of the work.
    pub(crate) fn modifies(&self, cmd: &str) -> bool {
        let list = &self.shell.modify_commands;
        if script_writes(cmd) || (writes_to_file(cmd.as_bytes()) && !self.saves_a_query(cmd)) {
            return true;
        }
        !list.is_empty() && Segments::new(cmd).any(|s| list.runs_segment(s) == Some(true))
    }

    /// Whether a shell command only shows the state of the whole work: it has a command, and
    /// every command of it is in `shell.state_queries` and names no path (`git diff --
    /// src/a.rs` asks about one file, and a review going file by file learns something new
    /// each time). A command that also modifies is not one: the caller asks
    /// [`FingerprintRules::modifies`] first.
    /// Whether a command line waits and then looks: one of its commands is a wait command
    /// (`shell.wait_commands`, also as the body of a loop: `do sleep 2`) and another is not
    /// (`sleep 30 && gh run view 42`, `until curl -sf host; do sleep 2; done`).
    pub(super) fn polls(&self, cmd: &str) -> bool {
        let waits = &self.shell.wait_commands;
        if !waits.iter().any(|w| cmd.contains(&**w)) {
            return false;
        }
        let (mut wait, mut look) = (false, false);
        for segment in Segments::new(cmd) {
            // The command of a segment, past the shell's own words (`until`, `do`, …).
            let first = segment
                .split_whitespace()
                .find(|w| !matches!(*w, "if" | "then" | "else" | "while" | "until" | "do"));
            match first.map(|w| w.rsplit('/').next().unwrap_or(w)) {
                None | Some("done" | "fi" | "for" | "true" | ":") => {}
                Some(w) if contains(waits, w) => wait = true,
                Some(_) => look = true,
            }
        }
        wait && look
    }

    /// Whether every command of a line is a state query (`shell.state_queries`, paths
    /// allowed) or a change of directory, and one is a query: what such a line writes with `>`
    /// is a copy of the state it shows.
    fn saves_a_query(&self, cmd: &str) -> bool {
        self.only_queries(cmd, true)
    }

    pub(super) fn queries(&self, cmd: &str) -> bool {
        self.only_queries(cmd, false)
    }

    /// Whether a line has a state query and every other command of it is one too; with
    /// `saved`, queries naming a path and changes of directory (`cd repo`) pass as well.
    fn only_queries(&self, cmd: &str, saved: bool) -> bool {
        let list = &self.shell.state_queries;
        // A line none of whose commands can be a query (most lines: no `git` in them) is
        // answered by a substring search.
        if !list.may_run(cmd.as_bytes()) {
            return false;
        }
        let mut any = false;
        for segment in Segments::new(cmd) {
            match list.runs_segment(segment) {
                Some(true) if saved || !segment_names_path(segment) => any = true,
                Some(false) if saved && changes_directory(segment) => {}
                Some(_) => return false,
                None => {}
            }
        }
        any
    }
}

/// The hash of a command line with its whitespace collapsed and none around `&`, `|` and `;`
/// outside quotes, so that `a && b`, `a&&b` and `a  &&  b` are one line.
fn operators_tight_hash(cmd: &str) -> u64 {
    super::canonical::with_scratch(|buf| {
        let mut quote = None;
        let mut space = false;
        for &c in cmd.trim().as_bytes() {
            match quote {
                Some(q) => {
                    buf.push(c);
                    if c == q {
                        quote = None;
                    }
                    continue;
                }
                None if c.is_ascii_whitespace() => {
                    space = true;
                    continue;
                }
                None => {}
            }
            let operator = matches!(c, b'&' | b'|' | b';');
            if space && !operator && !buf.last().is_some_and(|l| matches!(l, b'&' | b'|' | b';')) {
                buf.push(b' ');
            }
            space = false;
            if matches!(c, b'\'' | b'"') {
                quote = Some(c);
            }
            buf.push(c);
        }
        crate::hash::hash_bytes(tag::TEXT, buf)
    })
}

/// Whether a command segment only changes the directory (`cd dir`, `pushd dir`).
fn changes_directory(segment: &str) -> bool {
    matches!(
        segment.split_whitespace().next(),
        Some("cd" | "pushd" | "popd")
    )
}

/// The top of the work tree as a path: `.`, `./`.
fn is_top(w: &[u8]) -> bool {
    w == b"." || w == b"./"
}

/// Whether a command's words past its first name a path: an [operand](Operands) after `--`,
/// or one holding a `/` or a `.`; the top of the tree (`.`) and revision ranges
/// (`main..HEAD`) are no path. A branch such as `origin/main` reads as a path too, which only
/// ever makes a command count as a query less often.
fn names_path<'w>(words: impl Iterator<Item = &'w [u8]>) -> bool {
    Operands::new(words).any(|(w, after_dashes)| {
        let w = w.trim_ascii_start();
        let dotted = w.iter().any(|&c| c == b'/' || c == b'.');
        let range =
            w.windows(2).any(|p| p == b"..") && !w.windows(3).any(|p| p == b"../" || p == b"/..");
        !is_top(w) && (after_dashes || (dotted && !range))
    })
}

/// Global options that take the next word as their value (`git -C dir status`, `git -c k=v
/// diff`): a subcommand is looked for past them.
const VALUE_OPTIONS: [&[u8]; 2] = [b"-C", b"-c"];

/// Words of a command segment a subcommand is looked for among (past its options).
const SUBCOMMAND_WORDS: usize = 8;

/// The operands among a command's words: the words that are no option (`-x`, `--long`) and no
/// value of a [value option](VALUE_OPTIONS), each with whether it comes after `--` (where
/// every word is an operand).
struct Operands<I> {
    words: I,
    after_dashes: bool,
}

impl<I> Operands<I> {
    fn new(words: I) -> Operands<I> {
        Operands {
            words,
            after_dashes: false,
        }
    }
}

impl<'w, I: Iterator<Item = &'w [u8]>> Iterator for Operands<I> {
    type Item = (&'w [u8], bool);

    fn next(&mut self) -> Option<(&'w [u8], bool)> {
        loop {
            let w = self.words.next()?;
            if self.after_dashes || !w.starts_with(b"-") {
                return Some((w, self.after_dashes));
            }
            if w == b"--" {
                self.after_dashes = true;
            } else if VALUE_OPTIONS.contains(&w) {
                self.words.next();
            }
        }
    }
}

/// A command segment's subcommand: its first operand among the next few words.
fn subcommand<'w>(words: impl Iterator<Item = &'w [u8]>) -> Option<&'w [u8]> {
    Operands::new(words.take(SUBCOMMAND_WORDS))
        .next()
        .map(|(w, _)| w)
}

/// Whether a command segment's words past its first [name a path](names_path). The words are
/// split at ASCII whitespace when the segment is ASCII (the whitespace `split_whitespace` knows
/// there), else by `split_whitespace`.
fn segment_names_path(segment: &str) -> bool {
    let b = segment.as_bytes();
    if b.is_ascii() {
        names_path(AsciiWords { rest: b }.skip(1))
    } else {
        names_path(segment.split_whitespace().map(str::as_bytes).skip(1))
    }
}

/// The fuzzy key of a shell command line that does nothing ([`noop`]); its results are its
/// own text, so they are all one outcome.
pub(crate) const NOOP_FUZZY: u32 = 0x6e6f_6f70;

/// Whether a command line does nothing: each of its commands is `true`, `:`, or `echo` /
/// `printf` of literal words (no `$`, no backquote, no redirection, no glob), so what it
/// prints is its own text and it changes nothing; or it only shows where and who the shell is
/// (`pwd`, `whoami`, `hostname`, `date`), clears the screen, sets shell variables to literal
/// values (`restart=true`), or is a terminal's key name typed as a line (`C-c`, `Enter`: what
/// a terminal agent sends to interrupt or to wake a screen).
pub(crate) fn noop(cmd: &str) -> bool {
    // Most command lines start with a command that does something: settled by the first word.
    let first = cmd.split_ascii_whitespace().next().unwrap_or("");
    if !matches!(
        first,
        "true" | ":" | "echo" | "printf" | "pwd" | "whoami" | "hostname" | "date" | "clear"
    ) && !first.eq_ignore_ascii_case("cmd")
        && !first.eq_ignore_ascii_case("cmd.exe")
        && !key_name(first)
        && !assignment(first)
    {
        return false;
    }
    let b = cmd.as_bytes();
    if b.is_empty()
        || b.iter().any(|c| {
            matches!(
                c,
                b'$' | b'`' | b'>' | b'<' | b'*' | b'?' | b'[' | b'~' | b'\\'
            )
        })
    {
        return false;
    }
    let mut any = false;
    for segment in Segments::new(cmd) {
        let mut words = segment.split_whitespace();
        let mut first = words.next();
        // Windows' `cmd /c echo …`.
        if first.is_some_and(|w| w.eq_ignore_ascii_case("cmd") || w.eq_ignore_ascii_case("cmd.exe"))
            && words.next().is_some_and(|w| w.eq_ignore_ascii_case("/c"))
        {
            first = words.next();
        }
        let idle = match first {
            None => continue,
            Some("true" | ":" | "echo" | "printf") => true,
            Some("pwd") => words.all(|w| matches!(w, "-L" | "-P")),
            Some("whoami" | "hostname" | "clear") => words.next().is_none(),
            // Formats only: `date -s` sets the clock.
            Some("date") => words.all(|w| {
                w.starts_with('+') || matches!(w, "-u" | "-R" | "--utc") || w.starts_with("-I")
            }),
            Some(w) if key_name(w) => words.next().is_none(),
            Some(w) => assignment(w) && words.all(assignment),
        };
        if !idle {
            return false;
        }
        any = true;
    }
    any
}

/// A terminal's name for a key (tmux's spelling, as terminal agents send keys): `C-c`, `M-x`,
/// `Enter`, `Escape`.
fn key_name(w: &str) -> bool {
    match w.as_bytes() {
        [b'C' | b'M', b'-', k] => k.is_ascii_alphabetic(),
        _ => matches!(
            w,
            "Enter" | "Escape" | "Tab" | "BSpace" | "Up" | "Down" | "Left" | "Right"
        ),
    }
}

/// `NAME=value`: a shell variable set (the value's bytes are checked by the caller).
fn assignment(w: &str) -> bool {
    let Some((name, _)) = w.split_once('=') else {
        return false;
    };
    let mut b = name.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The command segments of a command line (between `\n`, `;`, `|`, `&` and `(`). The
/// separators are ASCII bytes, so each segment is whole characters.
struct Segments<'c> {
    cmd: &'c str,
    from: usize,
}

impl<'c> Segments<'c> {
    fn new(cmd: &'c str) -> Segments<'c> {
        Segments { cmd, from: 0 }
    }
}

impl<'c> Iterator for Segments<'c> {
    type Item = &'c str;

    #[inline]
    fn next(&mut self) -> Option<&'c str> {
        let b = self.cmd.as_bytes();
        let from = self.from;
        if from > b.len() {
            return None;
        }
        let rest = b.get(from..).unwrap_or_default();
        let end = rest
            .iter()
            .position(|&c| SEGMENT_ENDS[usize::from(c)])
            .map_or(b.len(), |p| from + p);
        self.from = end + 1;
        Some(self.cmd.get(from..end).unwrap_or_default())
    }
}

/// A list of shell commands (`shell.modify_commands`, `shell.state_queries`), each a first
/// word and, if it needs one, a second word: a flag it must carry (`sed -i`) or its subcommand
/// (`git commit`).
#[derive(Clone, Debug, Default)]
pub(crate) struct CommandList {
    /// Each command as its first word and the second word or flag it needs.
    pub(crate) commands: Vec<(Box<str>, Option<Box<str>>)>,
    /// The first words of `commands`, found by hash: most commands start with none.
    first_words: KeySet,
    /// For each of `first_words` (by position), the second words or flags its commands need
    /// (`None`: the first word alone).
    seconds: Vec<Vec<Option<Box<str>>>>,
}

impl CommandList {
    pub(crate) fn new(list: &[String]) -> CommandList {
        let commands: Vec<(Box<str>, Option<Box<str>>)> = list
            .iter()
            .filter_map(|m| {
                let mut w = m.split_whitespace();
                let first = w.next()?;
                Some((first.into(), w.next().map(Into::into)))
            })
            .collect();
        let first_words = KeySet::new(commands.iter().map(|(w, _)| &**w));
        let seconds = first_words
            .iter()
            .map(|first| {
                commands
                    .iter()
                    .filter(|(w, _)| **w == *first)
                    .map(|(_, second)| second.clone())
                    .collect()
            })
            .collect();
        CommandList {
            commands,
            first_words,
            seconds,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Whether a command line holds one of the list's first words anywhere: when it does not,
    /// no command of it [`CommandList::runs`] one of the list's.
    fn may_run(&self, line: &[u8]) -> bool {
        self.first_words.iter().any(|w| {
            let w = w.as_bytes();
            let Some(&head) = w.first() else {
                return false;
            };
            memchr::memchr_iter(head, line).any(|at| line.get(at..at + w.len()) == Some(w))
        })
    }

    /// [`CommandList::runs`] on one segment of a command line, split into words at ASCII
    /// whitespace when it is ASCII (the whitespace `split_whitespace` knows there), else by
    /// `split_whitespace`.
    #[inline]
    fn runs_segment(&self, segment: &str) -> Option<bool> {
        let b = segment.as_bytes();
        if b.is_ascii() {
            self.runs(AsciiWords { rest: b })
        } else {
            self.runs(segment.split_whitespace().map(str::as_bytes))
        }
    }

    /// Whether one command segment, given as its words, runs a command of the list: its first
    /// word past `sudo` and `VAR=value` words, with any directory dropped, is a first word of
    /// the list, with the flag it needs among its next words or the subcommand it needs as
    /// its first word past options. `None` for a segment with no command.
    fn runs<'w>(&self, words: impl Iterator<Item = &'w [u8]> + Clone) -> Option<bool> {
        let mut words =
            words.skip_while(|w| *w == b"sudo" || (w.contains(&b'=') && !w.starts_with(b"-")));
        let first = words.next()?;
        let first = first.rsplit(|&c| c == b'/').next().unwrap_or(first);
        let Some(seconds) = self
            .first_words
            .position_of_bytes(first)
            .and_then(|i| self.seconds.get(i))
        else {
            return Some(false);
        };
        // Looked for once, and only by a command that needs a subcommand.
        let mut sub = None;
        Some(seconds.iter().any(|second| {
            match second.as_deref() {
                None => true,
                Some(flag) if flag.starts_with('-') => words
                    .clone()
                    .take(SUBCOMMAND_WORDS)
                    .any(|r| r.starts_with(flag.as_bytes())),
                Some(name) => {
                    *sub.get_or_insert_with(|| subcommand(words.clone())) == Some(name.as_bytes())
                }
            }
        }))
    }
}
