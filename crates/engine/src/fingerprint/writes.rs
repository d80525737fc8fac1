//! Whole-file writes with literal content in a shell command line (`echo … > f`,
//! `printf … > f`, `cat > f <<'EOF' … EOF`), and whether the rest of the line leaves the
//! work's files alone. The session keeps what such writes put in each file, so that writing a
//! file again with the content it already holds is known to change nothing.
//!
//! The line is split into commands at `;`, `&`, `|`, `(`, `)` and newlines outside quotes,
//! command substitutions and here-document bodies; a here-document's body belongs to the
//! command that opened it.

use super::*;

/// At most this many literal writes of one line are kept; a line with more is taken as
/// changing files in ways not followed.
pub const MAX_WRITES: usize = 2;

/// One write of a whole file: a hash of the file as the call names it, and a hash of what
/// it writes. For a shell command's literal write, the target is even and the content is the
/// whole command that writes it (its text names both the content and the file); for an
/// editing tool's call, the target is odd (its path arguments) and the content is the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileWrite {
    pub target: u32,
    pub content: u32,
}

impl FileWrite {
    /// The write of an editing tool's call: its path arguments' hash and its exact key.
    pub fn by_tool(target: u64, exact: u32) -> FileWrite {
        FileWrite {
            target: target as u32 | 1,
            content: exact,
        }
    }

    pub fn by_shell(&self) -> bool {
        self.target & 1 == 0
    }
}

/// The literal writes of a shell command line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShellWrites {
    pub writes: [FileWrite; MAX_WRITES],
    pub len: u8,
    /// Every other command of the line leaves the work's files as they were: it changes
    /// nothing (`python app.py`, `cd d`), or only makes directories, touches files, changes
    /// modes or installs packages into the environment (`mkdir -p d`, `pip install x`).
    pub others_harmless: bool,
}

impl ShellWrites {
    pub fn as_slice(&self) -> &[FileWrite] {
        self.writes.get(..usize::from(self.len)).unwrap_or_default()
    }
}

const CONTENT_SEED: u64 = 0x6c69_7465_7261_6c31;
const TARGET_SEED: u64 = 0x7461_7267_6574_3031;

/// First words of modifying commands that leave the content of the work's files alone.
const HARMLESS: [&str; 10] = [
    "mkdir", "touch", "chmod", "chown", "pip", "pip3", "apt", "apt-get", "brew", "conda",
];

/// What the scan learns of one command of the line.
#[derive(Clone, Copy, Default)]
struct Command {
    start: usize,
    /// The file of its one `>` redirection (`start..end` in the line), if it has one.
    target: Option<(usize, usize)>,
    /// It writes in a way not followed: `>>`, a second `>`, a redirection of another stream
    /// to a file, or content that depends on the shell's state (a variable, a command
    /// substitution, also in a here-document's body with an unquoted delimiter).
    opaque: bool,
    heredoc: bool,
}

/// Reads the literal writes of `cmd`, a line that modifies (see
/// [`FingerprintRules::modifies`]); `modifies` says whether one command of it does.
pub(super) fn shell_writes(cmd: &str, modifies: impl Fn(&str) -> bool) -> ShellWrites {
    let b = cmd.as_bytes();
    let mut out = ShellWrites {
        others_harmless: true,
        ..ShellWrites::default()
    };
    let mut c = Command::default();
    // Here-documents opened on the current line: their delimiters, whether leading tabs are
    // stripped (`<<-`) and whether the body expands.
    let mut pending: [(usize, usize, bool, bool); 2] = [(0, 0, false, false); 2];
    let mut n_pending = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => i = skip_single(b, i),
            b'"' => {
                let (end, expands) = skip_double(b, i);
                c.opaque |= expands;
                i = end;
            }
            b'\\' => i += 2,
            b'`' => {
                c.opaque = true;
                i = skip_backticks(b, i);
            }
            b'$' if b.get(i + 1) == Some(&b'(') => {
                c.opaque = true;
                i = skip_parens(b, i + 1);
            }
            b'$' => {
                // A variable: what is written depends on the shell's state.
                c.opaque |= expands_at(b, i);
                i += 1;
            }
            b'<' if b.get(i + 1) == Some(&b'<') => {
                if b.get(i + 2) == Some(&b'<') {
                    i += 3;
                    continue;
                }
                let mut j = i + 2;
                let strip = b.get(j) == Some(&b'-');
                if strip {
                    j += 1;
                }
                while b.get(j).is_some_and(|&x| x == b' ' || x == b'\t') {
                    j += 1;
                }
                let (ds, de, end) = word(b, j);
                // An unquoted delimiter: variables and substitutions in the body expand.
                let expands = !matches!(b.get(j), Some(b'\'' | b'"'));
                if let Some(slot) = pending.get_mut(n_pending) {
                    *slot = (ds, de, strip, expands);
                    n_pending += 1;
                } else {
                    c.opaque = true;
                }
                c.heredoc = true;
                i = end.max(j + 1);
            }
            b'>' => {
                let fd_other = i > 0 && b[i - 1].is_ascii_digit() && b[i - 1] != b'1';
                let mut j = i + 1;
                let append = b.get(j) == Some(&b'>');
                if append {
                    j += 1;
                }
                if b.get(j) == Some(&b'&') {
                    // `>&2`: another stream, no file.
                    i = j + 1;
                    continue;
                }
                if b.get(j) == Some(&b'|') {
                    j += 1;
                }
                while b.get(j).is_some_and(|&x| x == b' ' || x == b'\t') {
                    j += 1;
                }
                let (ts, te, end) = word(b, j);
                let file = b.get(ts..te).unwrap_or_default();
                if !file.is_empty() && !file.starts_with(b"/dev/") {
                    if fd_other || append || c.target.is_some() {
                        c.opaque = true;
                    } else {
                        c.target = Some((ts, te));
                    }
                }
                i = end.max(j);
            }
            b'\n' => {
                let mut end = i;
                // The bodies of the here-documents opened on this line.
                for &(ds, de, strip, expands) in pending.iter().take(n_pending) {
                    let delim = b.get(ds..de).unwrap_or_default();
                    let from = end;
                    end = body_end(b, end, delim, strip);
                    let body = b.get(from..end).unwrap_or_default();
                    c.opaque |= expands
                        && body
                            .iter()
                            .enumerate()
                            .any(|(k, &x)| x == b'`' || (x == b'$' && expands_at(body, k)));
                }
                n_pending = 0;
                finish(cmd, &c, end, &modifies, &mut out);
                i = end + 1;
                c = Command {
                    start: i,
                    ..Command::default()
                };
            }
            b';' | b'&' | b'|' | b'(' | b')' => {
                // A here-document's body comes after the line: a command that ends before
                // it is not followed.
                c.opaque |= c.heredoc;
                finish(cmd, &c, i, &modifies, &mut out);
                i += 1;
                c = Command {
                    start: i,
                    ..Command::default()
                };
            }
            _ => i += 1,
        }
    }
    let mut end = b.len();
    for &(ds, de, strip, _) in pending.iter().take(n_pending) {
        let delim = b.get(ds..de).unwrap_or_default();
        end = body_end(b, end.min(b.len()), delim, strip);
    }
    finish(cmd, &c, end.min(b.len()), &modifies, &mut out);
    out
}

/// Judges one command of the line, `cmd[c.start..end]`.
fn finish(
    cmd: &str,
    c: &Command,
    end: usize,
    modifies: &impl Fn(&str) -> bool,
    out: &mut ShellWrites,
) {
    // Past the end: the line ended with a here-document's body.
    let Some(text) = cmd.get(c.start..end) else {
        return;
    };
    // The words before any redirection or here-document name the command.
    let head_end = text.find(['<', '>']).unwrap_or(text.len());
    let mut words = text[..head_end]
        .split_whitespace()
        .skip_while(|w| *w == "sudo" || (w.contains('=') && !w.starts_with('-')));
    let Some(first) = words.next() else {
        if c.target.is_some() || c.opaque {
            out.others_harmless = false;
        }
        return;
    };
    let first = first.rsplit('/').next().unwrap_or(first);
    if let Some((ts, te)) = c.target {
        let literal =
            !c.opaque && (matches!(first, "echo" | "printf") || (first == "cat" && c.heredoc));
        let slot = out.writes.get_mut(usize::from(out.len));
        match (literal, slot) {
            (true, Some(slot)) => {
                let file = unquote(cmd.get(ts..te).unwrap_or_default());
                let file = file.strip_prefix("./").unwrap_or(file);
                *slot = FileWrite {
                    // Even: the files of shell writes (see `FileWrite::target`).
                    target: hash_bytes(TARGET_SEED, file.as_bytes()) as u32 & !1,
                    content: hash_bytes(CONTENT_SEED, text.trim().as_bytes()) as u32,
                };
                out.len += 1;
            }
            _ => out.others_harmless = false,
        }
        return;
    }
    if c.opaque && text.contains('>') {
        out.others_harmless = false;
        return;
    }
    if modifies(text) && !HARMLESS.contains(&first) {
        out.others_harmless = false;
    }
}

/// Past a single-quoted string opening at `i`.
fn skip_single(b: &[u8], i: usize) -> usize {
    b.get(i + 1..)
        .and_then(|rest| memchr::memchr(b'\'', rest))
        .map_or(b.len(), |p| i + 1 + p + 1)
}

/// Past a double-quoted string opening at `i`, and whether it expands a variable or a
/// command.
fn skip_double(b: &[u8], i: usize) -> (usize, bool) {
    let mut j = i + 1;
    let mut expands = false;
    while let Some(&x) = b.get(j) {
        match x {
            b'\\' => j += 2,
            b'"' => return (j + 1, expands),
            b'`' => {
                expands = true;
                j += 1;
            }
            b'$' => {
                expands |= expands_at(b, j);
                j += 1;
            }
            _ => j += 1,
        }
    }
    (b.len(), expands)
}

/// Whether the `$` at `i` expands something: a name, `{…}`, `(…)`, a positional or special
/// parameter (a `$` before anything else is itself).
fn expands_at(b: &[u8], i: usize) -> bool {
    b.get(i + 1).is_some_and(|&x| {
        x.is_ascii_alphanumeric()
            || matches!(
                x,
                b'_' | b'{' | b'(' | b'?' | b'$' | b'!' | b'#' | b'@' | b'*' | b'-'
            )
    })
}

fn skip_backticks(b: &[u8], i: usize) -> usize {
    b.get(i + 1..)
        .and_then(|rest| memchr::memchr(b'`', rest))
        .map_or(b.len(), |p| i + 1 + p + 1)
}

/// Past the parenthesis opening at `i` and what it encloses (quotes respected).
fn skip_parens(b: &[u8], i: usize) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while let Some(&x) = b.get(j) {
        match x {
            b'(' => {
                depth += 1;
                j += 1;
            }
            b')' => {
                depth = depth.saturating_sub(1);
                j += 1;
                if depth == 0 {
                    return j;
                }
            }
            b'\'' => j = skip_single(b, j),
            b'"' => j = skip_double(b, j).0,
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
    b.len()
}

/// The word at `j` (quotes allowed in it): its text without the outer quotes of a quoted word
/// as `start..end`, and the position past it.
fn word(b: &[u8], j: usize) -> (usize, usize, usize) {
    match b.get(j) {
        Some(b'\'') => {
            let end = skip_single(b, j);
            (j + 1, end.saturating_sub(1).max(j + 1), end)
        }
        Some(b'"') => {
            let end = skip_double(b, j).0;
            (j + 1, end.saturating_sub(1).max(j + 1), end)
        }
        _ => {
            let len = b
                .get(j..)
                .unwrap_or_default()
                .iter()
                .position(|&x| {
                    x.is_ascii_whitespace()
                        || matches!(x, b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')')
                })
                .unwrap_or(b.len().saturating_sub(j));
            (j, j + len, j + len)
        }
    }
}

/// The end of a here-document's body that starts after the newline at `nl`: the end of its
/// delimiter line (or of the line).
fn body_end(b: &[u8], nl: usize, delim: &[u8], strip: bool) -> usize {
    let mut from = nl + 1;
    while from < b.len() {
        let end = b
            .get(from..)
            .and_then(|rest| memchr::memchr(b'\n', rest))
            .map_or(b.len(), |p| from + p);
        let mut line = b.get(from..end).unwrap_or_default();
        if strip {
            while let [b'\t', rest @ ..] = line {
                line = rest;
            }
        }
        if line == delim || line.strip_suffix(b"\r") == Some(delim) {
            return end;
        }
        from = end + 1;
    }
    b.len()
}

fn unquote(s: &str) -> &str {
    s.trim_matches(|c| c == '"' || c == '\'')
}
