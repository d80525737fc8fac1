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
//!
//! The rooms: this file holds the keys of a call from parsed arguments; [`raw`] the same keys
//! from arguments as JSON text, without parsing them; `canonical` the canonical forms of
//! strings; `keyset` the per-tool key sets; `shell` what a shell command does.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use loopguard_rules::NameGlob;
use regex::Regex;
use serde_json::{Map, Number, Value};

use crate::event::Arguments;
use crate::hash::{combine, hash_bytes, mix, tag};

mod canonical;
mod keyset;
mod raw;
mod shell;
#[cfg(test)]
mod tests;
mod writes;

use canonical::*;
use keyset::*;
use shell::*;
pub use writes::{FileWrite, ShellWrites};

pub use canonical::is_path_key;
pub(crate) use canonical::plain;
pub use keyset::KeySet;
pub use shell::file_of;
pub(crate) use shell::{CommandList, NOOP_FUZZY};

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
    pub(crate) tools: Vec<NameGlob>,
    pub(crate) command_keys: Vec<Box<str>>,
    pub(crate) file_read_commands: Vec<Box<str>>,
    pub(crate) file_operation_commands: Vec<Box<str>>,
    pub(crate) wait_commands: Vec<Box<str>>,
    /// `shell.modify_commands`.
    pub(crate) modify_commands: CommandList,
    /// `shell.state_queries`.
    pub(crate) state_queries: CommandList,
    pub(crate) complex_operators: Vec<Box<str>>,
    /// Whether a byte is the first byte of a complex operator.
    pub(crate) operator_starts: Box<[bool; 256]>,
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

/// What an argument key means for one tool.
#[derive(Clone, Copy, Debug, Default)]
struct Role {
    primary: bool,
    volatile: bool,
    /// Its position among the shell's command keys (shell tools only).
    command: Option<usize>,
    /// It holds a path ([`is_path_key`]).
    path: bool,
    /// A string value under it may ask an editing tool only to look ([`looks_read_only`]).
    read_only: bool,
    /// Which side of an edit it holds ([`edit_side`]).
    edit: EditSide,
    /// A free-text description of the target a sibling reference names ([`DESCRIPTION_KEY`]).
    describes: bool,
    /// It names the target exactly ([`REFERENCE_KEY`]).
    reference: bool,
    /// It holds code a tool runs ([`CODE_KEY`]).
    code: bool,
}

/// The argument holding the code a code-running tool executes (OpenHands'
/// `execute_ipython_cell`, smolagents' `python_interpreter`): code that writes files
/// ([`shell::code_writes`]) makes the call a write, as such a script run by a shell does.
const CODE_KEY: &str = "code";

/// The argument a browser tool's call describes its target with, in the model's own words
/// (Playwright MCP's `element`: "Human-readable element description used to obtain permission
/// to interact with the element"). Beside a [`REFERENCE_KEY`] naming the target exactly it is
/// no part of what the call does: the same click on the same `ref`, described as "Sign in
/// button" and then as "the Sign In button", is one call.
const DESCRIPTION_KEY: &str = "element";
/// The argument a shell tool's call narrates its command with (volatile for shell tools).
const SHELL_DESCRIPTION_KEY: &str = "description";
/// The argument naming a call's target exactly (a snapshot's element reference).
const REFERENCE_KEY: &str = "ref";

impl Role {
    /// The role of a key outside the tool's table of roles.
    #[inline]
    fn other(k: &str) -> Role {
        Role {
            path: is_path_key(k),
            read_only: is_read_only_key(k),
            edit: edit_side(k.as_bytes()),
            describes: k == DESCRIPTION_KEY,
            reference: k == REFERENCE_KEY,
            code: k == CODE_KEY,
            ..Role::default()
        }
    }

    /// [`Role::other`] of a key given as bytes.
    #[inline(never)]
    fn other_of_bytes(k: &[u8]) -> Role {
        Role {
            path: is_path_key_bytes(k),
            read_only: is_read_only_key_bytes(k),
            edit: edit_side(k),
            describes: k == DESCRIPTION_KEY.as_bytes(),
            reference: k == REFERENCE_KEY.as_bytes(),
            code: k == CODE_KEY.as_bytes(),
            ..Role::default()
        }
    }
}

impl ToolKeys {
    /// The role of an argument key (hashed with `key_hash`).
    #[inline(always)]
    fn role(&self, h: u64, k: &str) -> Role {
        match self
            .roles
            .position_hashed(h, k)
            .and_then(|i| self.role.get(i))
        {
            Some(r) => *r,
            None => Role::other(k),
        }
    }

    /// [`ToolKeys::role`] of a key given as bytes.
    #[inline(always)]
    fn role_of_bytes(&self, h: u64, k: &[u8]) -> Role {
        match self
            .roles
            .position_hashed_bytes(h, k)
            .and_then(|i| self.role.get(i))
        {
            Some(r) => *r,
            None => Role::other_of_bytes(k),
        }
    }
}

/// The keys of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallKeys {
    pub exact: u64,
    pub fuzzy: u64,
    /// A wait command (`sleep 30`): never counted by the repeat detectors.
    pub wait: bool,
    /// A command line that waits and then looks (`sleep 30 && gh run view 42`).
    pub poll: bool,
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
    /// The arguments replace a text with the same text (`old_str` equal to `new_str`): such an
    /// edit changes nothing.
    pub noop_edit: bool,
    /// The arguments name a text to replace and its replacement (`old_str` and `new_str`,
    /// `search` and `replace`, …), or hold code that writes files (a `code` argument running
    /// `open(p, 'w').write(s)`): the call edits, whatever its tool is named.
    pub edit: bool,
    /// A shell command that only shows the state of the work: every command of its line is
    /// one of `shell.state_queries` (`git status && git diff`).
    pub query: bool,
    /// The whole-file writes with literal content of a modifying shell command
    /// (`echo … > f`), and whether the rest of its line leaves files alone.
    pub writes: ShellWrites,
    /// What the call's path arguments name (`path`, `file_path`, `dir`, …): a hash of them
    /// all, 0 when it has none. A modifying tool's call changes that file.
    pub target: u64,
    /// The lines a shell command types (see [`Typed`]).
    pub typed: Typed,
}

/// The lines of a shell command as a terminal echoes them: a hash of each of its first
/// [`Typed::MAX`] lines, trimmed, blank lines left out. A terminal busy with a program that
/// does not read its input shows what is typed and nothing else; an output made only of such
/// lines says that the command did not run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Typed {
    pub n: u8,
    pub lines: [u32; Typed::MAX],
}

impl Typed {
    pub const MAX: usize = 8;

    /// The typed lines of `cmd`.
    pub fn of(cmd: &str) -> Typed {
        let mut t = Typed::default();
        for line in cmd.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some(slot) = t.lines.get_mut(usize::from(t.n)) else {
                break;
            };
            *slot = Typed::hash(line);
            t.n += 1;
        }
        t
    }

    /// The hash a typed line and an output line are compared by.
    #[inline]
    pub fn hash(line: &str) -> u32 {
        crate::hash::hash_bytes(0x7479_7065_645f_6c6e, line.as_bytes()) as u32
    }

    /// The hashes of the typed lines.
    pub fn hashes(&self) -> &[u32] {
        self.lines.get(..usize::from(self.n)).unwrap_or(&[])
    }
}

/// The side of a replacement an argument key names: the text replaced, or its replacement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum EditSide {
    #[default]
    None,
    Old,
    New,
}

/// The side of a replacement a top-level argument key names, as the common editing tools spell
/// it (`old_str` / `new_str`, `old_string` / `new_string`, `oldText` / `newText`, `search` /
/// `replace`, …).
fn edit_side(k: &[u8]) -> EditSide {
    match k {
        b"old_str" | b"old_string" | b"old" | b"old_text" | b"oldText" | b"old_content"
        | b"search" | b"original" => EditSide::Old,
        b"new_str" | b"new_string" | b"new" | b"new_text" | b"newText" | b"new_content"
        | b"replace" | b"replacement" | b"updated" => EditSide::New,
        _ => EditSide::None,
    }
}

/// Whether the replaced and the replacing texts of an edit (at most one string of each side
/// seen) are the same text, byte for byte: whitespace matters to a file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EditSides<T> {
    old: Option<T>,
    new: Option<T>,
    /// More than one string of a side: the pair is not known.
    spoilt: bool,
}

impl<T> Default for EditSides<T> {
    fn default() -> Self {
        EditSides {
            old: None,
            new: None,
            spoilt: false,
        }
    }
}

impl<T: Copy> EditSides<T> {
    /// Notes a string value under a key of `side`.
    pub(crate) fn see(&mut self, side: EditSide, v: T) {
        let slot = match side {
            EditSide::None => return,
            EditSide::Old => &mut self.old,
            EditSide::New => &mut self.new,
        };
        self.spoilt |= slot.is_some();
        *slot = Some(v);
    }

    /// Whether both sides were seen: the arguments are shaped as an edit.
    pub(crate) fn both(&self) -> bool {
        self.old.is_some() && self.new.is_some()
    }

    /// Whether both sides were seen once each and `same` says they are equal.
    pub(crate) fn same(&self, same: impl Fn(T, T) -> bool) -> bool {
        match (self.old, self.new) {
            (Some(a), Some(b)) if !self.spoilt => same(a, b),
            _ => false,
        }
    }
}

/// A top-level argument asks an editing tool only to look (`command: view`, `action: read`,
/// …) when its key is one of these and its value [`looks_read_only`].
fn is_read_only_key(k: &str) -> bool {
    is_read_only_key_bytes(k.as_bytes())
}

/// [`is_read_only_key`] of a key given as bytes.
fn is_read_only_key_bytes(k: &[u8]) -> bool {
    matches!(k, b"command" | b"action" | b"mode" | b"operation")
}

/// What a call's top-level arguments say about whether it only waits: an empty text to send
/// and a time to wait (`{"keystrokes": "", "duration": 30}`, `{"session_id": 3, "chars": "",
/// "yield_time_ms": 5000}`), with nothing else but ids, numbers and flags. A terminal agent
/// sends such a call to let a command run on and to look at the screen again, whatever its
/// tool is named: it is a wait (`flag::WAIT`), as `sleep` is.
#[derive(Clone, Copy, Default)]
struct WaitArgs {
    /// A number under a key that names a time to wait.
    time: bool,
    /// An empty string under a key that names text to send.
    empty_input: bool,
    /// Anything else that asks for work: a string other than an id, an array, an object.
    other: bool,
}

/// The kind of a top-level argument value, for [`WaitArgs`].
#[derive(Clone, Copy)]
enum ArgKind {
    EmptyStr,
    Str,
    Number,
    /// `true`, `false`, `null`.
    Flag,
    /// An array or an object.
    Nested,
}

impl WaitArgs {
    #[inline]
    fn see(&mut self, k: &[u8], v: ArgKind) {
        if self.other {
            return;
        }
        match v {
            ArgKind::Number => self.time |= is_wait_time_key(k),
            ArgKind::EmptyStr => self.empty_input |= is_input_key(k),
            ArgKind::Str => self.other = !is_ident_key(k),
            ArgKind::Flag => {}
            ArgKind::Nested => self.other = true,
        }
    }

    fn waits(&self) -> bool {
        self.time && self.empty_input && !self.other
    }
}

/// Whether `k` is one of `keys`, whatever its case.
fn one_of(k: &[u8], keys: &[&[u8]]) -> bool {
    keys.iter().any(|w| w.eq_ignore_ascii_case(k))
}

/// Keys that name a time to wait.
fn is_wait_time_key(k: &[u8]) -> bool {
    one_of(
        k,
        &[
            b"duration",
            b"duration_ms",
            b"wait",
            b"wait_time",
            b"wait_ms",
            b"wait_seconds",
            b"wait_secs",
            b"timeout",
            b"timeout_ms",
            b"timeout_seconds",
            b"yield_time_ms",
            b"yield_ms",
            b"seconds",
            b"secs",
            b"delay",
            b"delay_ms",
            b"sleep",
            b"sleep_ms",
        ],
    )
}

/// Keys that name text sent to a terminal or a process.
fn is_input_key(k: &[u8]) -> bool {
    one_of(
        k,
        &[
            b"keystrokes",
            b"keys",
            b"chars",
            b"input",
            b"text",
            b"data",
            b"stdin",
            b"command",
        ],
    )
}

/// Keys that name what is waited on rather than work to do: an id (`session_id`, `bashId`,
/// `id`), a session, a terminal or its pane.
fn is_ident_key(k: &[u8]) -> bool {
    k.len() >= 2 && k[k.len() - 2..].eq_ignore_ascii_case(b"id")
        || one_of(
            k,
            &[
                b"session",
                b"terminal",
                b"pane",
                b"window",
                b"tab",
                b"target",
            ],
        )
}

/// The values of a [read-only key](is_read_only_key) that ask only to look.
/// A screen tool's looks (`computer` with `action: screenshot`) are among them: the actions
/// around them change the screen, they only show it.
fn looks_read_only(v: &str) -> bool {
    match v.len() {
        3 | 4 => ["view", "read", "list", "show", "get", "cat", "open", "zoom"]
            .iter()
            .any(|w| v.eq_ignore_ascii_case(w)),
        10 => v.eq_ignore_ascii_case("screenshot"),
        15 => v.eq_ignore_ascii_case("cursor_position"),
        _ => false,
    }
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
/// Mixed into the fuzzy key of a call with primary arguments.
const FUZZY_TAG: u64 = 0x00f0_22e7;
/// Seeds the ordered member chain of objects when keys are not sorted.
const ORDERED: u64 = 0x6f72_6465_7265_6421;
/// Seeds tool-name hashes.
const TOOL: u64 = 0x746f_6f6c_6e61_6d65;

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
        let mut operator_starts = Box::new([false; 256]);
        for op in &c.shell.complex_operators {
            if let Some(&b) = op.as_bytes().first() {
                operator_starts[usize::from(b)] = true;
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
                modify_commands: CommandList::new(&c.shell.modify_commands),
                state_queries: CommandList::new(&c.shell.state_queries),
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
        // A shell tool in a namespace (`functions.shell`) is one as its category is.
        let bare = loopguard_rules::config::bare_name(name);
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
        // A shell tool's `description` (Claude Code's `Bash`, Gemini CLI's
        // `run_shell_command`) is the model's narration of the command, not part of it.
        let shell = self
            .shell
            .tools
            .iter()
            .any(|g| g.is_match(name) || g.is_match(bare));
        let volatile = KeySet::new(
            self.volatile_keys
                .iter()
                .map(|s| &**s)
                .chain(
                    per_tool
                        .iter()
                        .flat_map(|t| t.volatile_keys.iter().map(String::as_str)),
                )
                .chain(shell.then_some(SHELL_DESCRIPTION_KEY)),
        );
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
                ..Role::other(k)
            })
            .collect();
        ToolKeys {
            tool_hash: hash_bytes(TOOL, name.as_bytes()),
            primary,
            volatile,
            shell,
            read_tool: READ_TOOLS
                .iter()
                .any(|r| r.eq_ignore_ascii_case(tool) || r.eq_ignore_ascii_case(bare)),
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
        let mut edit = EditSides::<&str>::default();
        let mut code_writes = false;
        let mut target = 0u64;
        let mut wait = WaitArgs::default();
        for (k, x) in map {
            let kh = key_hash(k);
            let role = tool.role(kh, k);
            wait.see(
                k.as_bytes(),
                match x {
                    Value::String(s) if s.is_empty() => ArgKind::EmptyStr,
                    Value::String(_) => ArgKind::Str,
                    Value::Number(_) => ArgKind::Number,
                    Value::Bool(_) | Value::Null => ArgKind::Flag,
                    Value::Array(_) | Value::Object(_) => ArgKind::Nested,
                },
            );
            if role.read_only
                && let Value::String(s) = x
                && looks_read_only(s)
            {
                read_only = true;
            }
            if let Value::String(s) = x {
                edit.see(role.edit, s.as_str());
                code_writes |= role.code && shell::code_writes(s);
            }
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
            // A description beside the reference it describes is left out (see
            // [`DESCRIPTION_KEY`]); looked up only for a member under that key.
            if role.volatile || (role.describes && map.contains_key(REFERENCE_KEY)) {
                continue;
            }
            let value = match x {
                Value::String(s) => {
                    let path_key = role.path;
                    let text = self.text_hash(s, path_key);
                    if path_key {
                        target = target.wrapping_add(mix(kh, mix(tag::STRING, text)));
                    }
                    if is_command
                        && !path_key
                        && let Some(c) = &mut command
                    {
                        c.text = Some(text);
                    }
                    mix(tag::STRING, text)
                }
                Value::Array(_) => self.value_hash(x, role.path, tool),
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
            noop_edit: edit.same(|a, b| a == b),
            edit: edit.both() || code_writes,
            target,
            wait: wait.waits(),
            ..CallKeys::default()
        };
        if let Some(c) = command
            && let Some(cmd) = c.value.as_str()
        {
            self.shell_keys(tool, cmd, c.text, &mut keys, test_commands);
            return keys;
        }
        // A command as an argument vector running a shell script (`["bash", "-lc", "…"]`, as
        // Codex sends it): the script is the command, normalized as a command string is (its
        // fuzzy key, a file it reads, a wait, a line that does nothing). The exact key stays
        // the vector's.
        if let Some(c) = command
            && let Some(script) = shell_script(c.value)
        {
            self.shell_keys(tool, script, None, &mut keys, test_commands);
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
                    let role = tool.role(kh, k);
                    if role.volatile {
                        continue;
                    }
                    let member = mix(kh, self.value_hash(x, role.path, tool));
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
}
