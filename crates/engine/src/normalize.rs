//! Result normalization: noise (ANSI codes, timestamps, ids, pids, durations, counters, temp
//! paths) is masked in one hand-written pass, the policy's extra regexes are applied, and what is
//! left is hashed into a digest. The result is also classified as error, empty or retryable.
//!
//! The rooms: `mask` holds the built-in maskers (one pass over the bytes, a byte-class table
//! ruling out what cannot start a masker), `sketch` the near-duplicate sketch, this file the
//! digest and the classification; `reference` (tests only) the maskers, the sketch and the
//! outcome written plainly, which property tests hold the others to, bit for bit (digests and
//! sketches are kept in session snapshots, so they never change for the same text within a
//! snapshot version).
//!
//! The work per result is bounded: a result longer than twice `results.max_bytes` is masked
//! and hashed by its first and last `max_bytes` only (joined by `\n<…>\n`); the sketch reads
//! at most [`sketch::SKETCH_MAX_WORDS`] words of the masked text; the error patterns read its
//! first 512 bytes. The masked text is written to a per-thread buffer (the policy's regexes,
//! `results.patterns` and the empty, error and retryable patterns, read it as a string), so the
//! steady state allocates nothing. A policy with `results.patterns` pays one regex pass per
//! pattern over that text, and a new string when a pattern replaced something; the default
//! policy has none.

use std::cell::RefCell;

use regex::Regex;

use crate::event::ToolResult;
use crate::hash::{StreamHasher, hash_bytes};

mod mask;
mod out;
#[cfg(test)]
mod reference;
mod sketch;
#[cfg(test)]
mod tests;

pub use sketch::{SKETCH_MIN_WORDS, SKETCH_NEAR_BITS, sketch};

/// Which built-in maskers are on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Maskers {
    pub ansi: bool,
    pub timestamps: bool,
    pub uuids: bool,
    pub hex_ids: bool,
    pub pids: bool,
    pub durations: bool,
    pub counters: bool,
    pub temp_paths: bool,
    pub ids: bool,
}

/// Result rules compiled from the policy.
#[derive(Clone, Debug)]
pub struct ResultRules {
    pub(crate) maskers: Maskers,
    pub(crate) patterns: Vec<(Regex, String)>,
    pub(crate) empty: Vec<Regex>,
    /// `empty` as one set, searched once (`None` when the set could not be built: then each
    /// pattern is searched).
    empty_any: Option<regex::RegexSet>,
    pub(crate) errors: Vec<Regex>,
    /// `results.error_tail_patterns`, read on the output's last [`TAIL_BYTES`].
    pub(crate) error_tails: Vec<Regex>,
    /// `error_tails` as one alternation, searched once (`None` when it could not be built, or
    /// there are none: then each pattern is searched).
    error_tail_any: Option<Regex>,
    pub(crate) retryable: Vec<Regex>,
    pub(crate) max_bytes: usize,
}

/// A normalized result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub digest: u64,
    /// A failure's near-duplicate sketch of the masked text (see [`sketch()`]): `None` for a
    /// short failure, and for every success (successes are compared by digest only: there one
    /// changed word can be the news, which a sketch cannot tell from noise). It is keyed (XOR)
    /// by a hash of the error line the failure's signature names, when it names one between its
    /// first and last lines: pages alike around different errors are far apart, pages alike
    /// around the same error stay close.
    pub sketch: Option<u64>,
    /// The masked text has [`SKETCH_MIN_WORDS`] words or more: an answer with something in it,
    /// rather than a short acknowledgement (`ok`) that repeats in healthy work.
    pub long: bool,
    pub error: bool,
    pub empty: bool,
    /// Infrastructure trouble (rate limits, 5xx): retrying is not a loop. Only errors are.
    pub retryable: bool,
    /// The output only echoes lines the session typed: the command did not run (a terminal
    /// busy with another program). Such an output is a failure, the same for every command.
    pub echo: bool,
    /// A failure whose signature names a syntax error (`IndentationError: …`): its digest with
    /// that error known by its type alone ([`syntax_error`]). A test run's failures compare by
    /// it: code that does not parse is one state, whatever the parser says of it, while an
    /// edit a linter rejects for another syntax error is another proposal.
    pub syntax: Option<u64>,
}

thread_local! {
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

const BUF_KEEP: usize = 1 << 20;

impl ResultRules {
    pub fn from_config(c: &loopguard_rules::Config) -> ResultRules {
        let mut m = Maskers::default();
        for name in &c.results.mask {
            match name.as_str() {
                "ansi" => m.ansi = true,
                "timestamps" => m.timestamps = true,
                "uuids" => m.uuids = true,
                "hex_ids" => m.hex_ids = true,
                "pids" => m.pids = true,
                "durations" => m.durations = true,
                "counters" => m.counters = true,
                "temp_paths" => m.temp_paths = true,
                "ids" => m.ids = true,
                _ => {}
            }
        }
        ResultRules {
            maskers: m,
            patterns: c
                .results
                .patterns
                .iter()
                .map(|p| (p.regex.clone(), p.replace.clone()))
                .collect(),
            empty: c.results.empty_patterns.clone(),
            // Within the limits the policy's regexes were compiled with (each 1 MiB, 4 MiB a
            // policy); a set over them is left out.
            empty_any: regex::RegexSetBuilder::new(
                c.results.empty_patterns.iter().map(Regex::as_str),
            )
            .size_limit(4 << 20)
            .dfa_size_limit(1 << 20)
            .build()
            .ok(),
            errors: c.results.error_patterns.clone(),
            error_tails: c.results.error_tail_patterns.clone(),
            // Each pattern in a group of its own keeps its inline flags to itself.
            error_tail_any: (!c.results.error_tail_patterns.is_empty())
                .then(|| {
                    let joined = c
                        .results
                        .error_tail_patterns
                        .iter()
                        .map(|re| format!("(?:{})", re.as_str()))
                        .collect::<Vec<_>>()
                        .join("|");
                    regex::RegexBuilder::new(&joined)
                        .size_limit(4 << 20)
                        .dfa_size_limit(1 << 20)
                        .build()
                        .ok()
                })
                .flatten(),
            retryable: c.results.retryable_patterns.clone(),
            max_bytes: c.results.max_bytes.max(1),
        }
    }

    /// Normalizes, hashes and classifies a result. Uses a per-thread buffer, so nothing is
    /// allocated per result in steady state.
    pub fn outcome(&self, r: &ToolResult<'_>) -> Outcome {
        self.outcome_typed(r, &[])
    }

    /// [`Self::outcome`] of a shell command's result, `typed` the hashes of the lines the
    /// session typed last ([`crate::fingerprint::Typed`]): an output made only of them is
    /// their echo, the command did not run ([`Outcome::echo`]).
    pub fn outcome_typed(&self, r: &ToolResult<'_>, typed: &[u32]) -> Outcome {
        BUF.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                let o = self.outcome_in(r, typed, &mut buf);
                if buf.capacity() > BUF_KEEP {
                    *buf = Vec::new();
                }
                o
            }
            Err(_) => self.outcome_in(r, typed, &mut Vec::new()),
        })
    }

    fn outcome_in(&self, r: &ToolResult<'_>, typed: &[u32], buf: &mut Vec<u8>) -> Outcome {
        let mut out = out::Out::new(buf);
        let text = r.output;
        let max = self.max_bytes;
        if text.len() > 2 * max {
            let mut head = max;
            while !text.is_char_boundary(head) {
                head -= 1;
            }
            let mut tail = text.len() - max;
            while !text.is_char_boundary(tail) {
                tail += 1;
            }
            mask::mask_into(&self.maskers, &text[..head], &mut out);
            out.bytes("\n<…>\n".as_bytes());
            mask::mask_into(&self.maskers, &text[tail..], &mut out);
        } else {
            mask::mask_into(&self.maskers, text, &mut out);
        }
        // Whole characters of the output and ASCII replacements: always UTF-8.
        let masked = std::str::from_utf8(out.written()).unwrap_or_default();
        // The policy's patterns make a new string only when one replaced something.
        let mut replaced: Option<String> = None;
        for (re, rep) in &self.patterns {
            let now = replaced.as_deref().unwrap_or(masked);
            let next = match re.replace_all(now, rep.as_str()) {
                std::borrow::Cow::Owned(s) => Some(s),
                std::borrow::Cow::Borrowed(_) => None,
            };
            if next.is_some() {
                replaced = next;
            }
        }
        let text = replaced.as_deref().unwrap_or(masked);
        if !typed.is_empty() && echoes(text, typed) {
            return Outcome {
                digest: ECHO_DIGEST,
                error: true,
                echo: true,
                ..Outcome::default()
            };
        }
        self.judge(r, text)
    }

    /// The outcome of a result from its masked text.
    fn judge(&self, r: &ToolResult<'_>, buf: &str) -> Outcome {
        let masked = buf.trim();
        let error = r.is_error
            || match r.exit_code {
                Some(code) => code != 0,
                None => {
                    let head = head_of(masked, 512);
                    let tail = tail_of(r.output, TAIL_BYTES);
                    self.errors.iter().any(|re| re.is_match(head))
                        || (!self.error_tails.is_empty()
                            && match &self.error_tail_any {
                                Some(re) => re.is_match(tail),
                                None => self.error_tails.iter().any(|re| re.is_match(tail)),
                            })
                        || partly_passed(head)
                        || partly_passed(tail)
                }
            };
        // A failure is known by its signature, its first and last lines and the first line
        // between them that names an error ([`names_error`]): the same error for different
        // attempts (other content, other arguments echoed in between) is the same outcome,
        // while a harness's fixed header and footer around another error are not. A failure
        // that ends with an exception (`TypeError: …`, [`exception_at`]) is known by that
        // exception alone: what comes before it is the code, the location or the output that
        // led there.
        let (digest, named_key, syntax) = if error {
            let mut lines = masked
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !is_label_line(l));
            let first = lines.next().unwrap_or("");
            let last = lines.next_back().unwrap_or("");
            let named = if names_error(first) || names_error(last) {
                None
            } else {
                lines.take(SIGNATURE_SCAN_LINES).find(|l| names_error(l))
            };
            let ending = if last.is_empty() { first } else { last };
            let exception = exception_at(ending).map(|at| &ending[at..]);
            // The syntax errors the ending and the named line say, by their types.
            let ending_syntax = exception.and_then(syntax_error);
            let named_syntax =
                named.and_then(|n| exception_at(n).and_then(|at| syntax_error(&n[at..])));
            // The signature, its syntax error (if it names one) by its type alone and the file
            // the parser stopped in.
            let sign = |syntax: bool| {
                let mut h = StreamHasher::new();
                if syntax {
                    h.bytes(syntax_file(masked).as_bytes());
                    h.byte(0);
                }
                if let Some(e) = exception {
                    h.byte(3);
                    match ending_syntax.filter(|_| syntax) {
                        Some(kind) => h.bytes(kind.as_bytes()),
                        None => signature_line(&mut h, e.as_bytes()),
                    }
                } else {
                    h.byte(1);
                    signature_line(&mut h, first.as_bytes());
                    h.byte(b'\n');
                    signature_line(&mut h, last.as_bytes());
                }
                if let Some(named) = named {
                    let kind = named_syntax.filter(|_| syntax);
                    h.byte(b'\n');
                    signature_line(&mut h, kind.unwrap_or(named).as_bytes());
                }
                h.finish()
            };
            let named_key = named.map_or(0, |named| {
                let mut k = StreamHasher::new();
                k.byte(2);
                signature_line(&mut k, named.as_bytes());
                k.finish()
            });
            let syntax = (ending_syntax.is_some() || named_syntax.is_some()).then(|| sign(true));
            (sign(false), named_key, syntax)
        } else {
            (digest_folding_ends(without_id_ends(masked)), 0, None)
        };
        let sketched = if error {
            sketch(masked).map(|s| s ^ named_key)
        } else {
            None
        };
        // An answer that found nothing is short: a longer one is not searched for the words
        // that say so (a long output is not read to its end for them).
        let empty = (error && says_nothing(masked))
            || (masked.len() <= EMPTY_MAX_BYTES
                && match &self.empty_any {
                    Some(set) => set.is_match(buf),
                    None => self.empty.iter().any(|re| re.is_match(buf)),
                });
        Outcome {
            // Nothing found is one answer, however a tool words it and whatever it echoes of
            // the request (`No matches found for pattern "retry" in path "src"`): different
            // searches that all find nothing learn the same.
            digest: if empty && !error {
                EMPTY_DIGEST
            } else {
                digest
            },
            // A failure's sketch is keyed by the error it names: near-duplicate pages around
            // different errors (a linter's report of other errors, the rest the agent's own
            // proposal echoed back) are sketches far apart.
            sketch: sketched,
            long: sketched.is_some() || (!error && sketch::has_words(masked, SKETCH_MIN_WORDS)),
            error,
            // A failure that says nothing but its exit code (`grep` finding no match) is an
            // empty answer.
            empty,
            retryable: error && retryable(&self.retryable, masked),
            echo: false,
            syntax,
        }
    }
}

/// The longest masked, trimmed result that `results.empty_patterns` are tried on.
pub(crate) const EMPTY_MAX_BYTES: usize = 4096;

/// The digest of every successful answer that found nothing ([`Outcome::empty`]).
const EMPTY_DIGEST: u64 = 0x6e6f_7468_696e_6721;

/// The digest of every output that only echoes what was typed: one outcome, whatever was typed.
const ECHO_DIGEST: u64 = 0x6563_686f_5f6f_6e6c;

/// At most this many bytes of masked output are read for an echo: a terminal showing only
/// what was typed shows a screen at most.
const ECHO_MAX_BYTES: usize = 4096;

/// Whether every non-blank line of `text` (at least one) is one of the `typed` lines: a
/// terminal busy with a program that does not read its input showed what the agent typed and
/// nothing else. A shell prompt before a line, or any line the command printed, makes it no
/// echo.
fn echoes(text: &str, typed: &[u32]) -> bool {
    if text.len() > ECHO_MAX_BYTES {
        return false;
    }
    let mut lines = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !typed.contains(&crate::fingerprint::Typed::hash(line)) {
            return false;
        }
        lines += 1;
    }
    lines > 0
}

/// Whether a line of `text` says that only some tests passed: `9/11 tests passed`, `3 of 5
/// checks passed` (a harness's summary, which may list no failure by name).
fn partly_passed(text: &str) -> bool {
    fn number(s: &str) -> Option<(u64, &str)> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let n = s
            .get(..end)
            .filter(|d| !d.is_empty() && d.len() <= 9)?
            .parse()
            .ok()?;
        Some((n, &s[end..]))
    }
    let says = |line: &str| -> Option<bool> {
        let (passed, rest) = number(line.trim_start())?;
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix('/')
            .or_else(|| rest.strip_prefix("of "))?
            .trim_start();
        let (total, rest) = number(rest)?;
        let mut words = rest.split_whitespace();
        let what = words.next()?.to_ascii_lowercase();
        let verb = words.next()?.to_ascii_lowercase();
        let what = what.trim_end_matches('s');
        let verb = verb.trim_end_matches(|c: char| !c.is_ascii_alphabetic());
        Some(
            matches!(what, "test" | "check" | "spec" | "case")
                && matches!(verb, "passed" | "passing" | "succeeded" | "ok")
                && passed < total,
        )
    };
    text.lines().take(64).any(|l| says(l) == Some(true))
}

/// Lines of a failure searched for the line that names its error.
const SIGNATURE_SCAN_LINES: usize = 200;

/// Whether a line names an error: it holds an error type (`IndentationError:`,
/// `java.lang.NullPointerException`: a word of letters ending in `Error` or `Exception`) or
/// starts as a compiler's error does (`error[E0308]:`, `error:`).
fn names_error(line: &str) -> bool {
    let b = line.as_bytes();
    if b.len() > 1000 {
        return false;
    }
    if b.starts_with(b"error[") || b.starts_with(b"error:") {
        return true;
    }
    let typed = |suffix: &[u8]| {
        memchr::memmem::find_iter(b, suffix).any(|at| {
            at > 0
                && b[at - 1].is_ascii_alphabetic()
                && !b
                    .get(at + suffix.len())
                    .is_some_and(u8::is_ascii_alphanumeric)
        })
    };
    typed(b"Error") || typed(b"Exception")
}

/// Where the last exception named in `line` starts: a type of letters, digits, `_` and `.`
/// whose last part ends in `Error` or `Exception` after a letter (`TypeError`,
/// `sqlite3.OperationalError`, `java.lang.NullPointerException`), followed by `:` or ending the
/// line. A type followed by anything else (`raise ValueError(msg)`, `ValueError is raised`) is
/// mentioned, not thrown.
fn exception_at(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    if b.len() > 1000 {
        return None;
    }
    let mut found = None;
    for suffix in [&b"Error"[..], b"Exception"] {
        for at in memchr::memmem::find_iter(b, suffix) {
            let end = at + suffix.len();
            if at == 0
                || !b[at - 1].is_ascii_alphabetic()
                || !matches!(b.get(end), None | Some(b':'))
            {
                continue;
            }
            let mut start = at;
            while start > 0
                && (b[start - 1].is_ascii_alphanumeric() || matches!(b[start - 1], b'_' | b'.'))
            {
                start -= 1;
            }
            if found.is_none_or(|f| start > f) {
                found = Some(start);
            }
        }
    }
    found
}

/// The type of an exception (`exception` starts with it) that says code does not parse
/// (`SyntaxError`, `IndentationError`, `TabError`, maybe with a module before it): the code
/// never ran, whatever the parser's words for why (`expected an indented block`, `unindent
/// does not match any outer indentation level`) or the line it stopped at (its file is kept:
/// [`syntax_file`]).
pub(super) fn syntax_error(exception: &str) -> Option<&str> {
    let end = exception.find(':').unwrap_or(exception.len());
    let kind = exception[..end].trim_end();
    let last = kind.rsplit('.').next().unwrap_or(kind);
    matches!(last, "SyntaxError" | "IndentationError" | "TabError").then_some(kind)
}

/// The file of the last frame of a Python traceback in `text` (`File "/repo/app.py", line
/// 3`): where a syntax error stopped the parser. Empty when there is none.
pub(super) fn syntax_file(text: &str) -> &str {
    const FRAME: &[u8] = b"File \"";
    memchr::memmem::rfind(text.as_bytes(), FRAME).map_or("", |at| {
        let rest = &text[at + FRAME.len()..];
        rest.find(['"', '\n']).map_or(rest, |end| &rest[..end])
    })
}

/// Bytes read from the end of a result for `results.error_tail_patterns`.
const TAIL_BYTES: usize = 512;

/// Bytes read from each end of a failure for `results.retryable_patterns`.
pub(super) const RETRYABLE_BYTES: usize = 512;

/// Whether a failure's masked text says, at its start or its end, that the trouble was the
/// infrastructure's (a rate limit, a 5xx, a connection reset): where a client or a harness
/// reports it. What the output quotes in between (a task's text, a page, a test's expected
/// status) says nothing of why this call failed.
pub(super) fn retryable(patterns: &[Regex], masked: &str) -> bool {
    if patterns.is_empty() {
        return false;
    }
    let (head, tail) = (
        head_of(masked, RETRYABLE_BYTES),
        tail_of(masked, RETRYABLE_BYTES),
    );
    patterns
        .iter()
        .any(|re| re.is_match(head) || (tail.len() < masked.len() && re.is_match(tail)))
}

/// The first `n` bytes of `text` or fewer, to a character boundary.
fn head_of(text: &str, n: usize) -> &str {
    let mut to = text.len().min(n);
    while !text.is_char_boundary(to) {
        to -= 1;
    }
    &text[..to]
}

/// The last `n` bytes of `text` or fewer, from a character boundary.
fn tail_of(text: &str, n: usize) -> &str {
    let mut from = text.len().saturating_sub(n);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    &text[from..]
}

/// Whether a line of a failure is a harness's label rather than part of what failed: it only
/// names an id ([`is_id_line`]) or is only markup (`<output>`, `</output>`,
/// `<returncode>1</returncode>`: mini-swe-agent wraps every observation so), which every
/// failure of that harness shares.
pub(super) fn is_label_line(line: &str) -> bool {
    is_id_line(line) || is_markup_line(line)
}

/// Whether a line is one tag, or one tag around a short value (at most 12 bytes, no markup).
fn is_markup_line(line: &str) -> bool {
    let b = line.as_bytes();
    if b.len() > 80 || b.first() != Some(&b'<') || b.last() != Some(&b'>') {
        return false;
    }
    let tag = |t: &[u8]| {
        let t = t.strip_prefix(b"/").unwrap_or(t);
        !t.is_empty()
            && t.len() <= 32
            && t.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
    };
    let inner = &b[1..b.len() - 1];
    match memchr::memchr(b'>', inner) {
        None => tag(inner),
        Some(end) => {
            let (open, rest) = (&inner[..end], &inner[end + 1..]);
            let Some(close) = memchr::memrchr(b'<', rest) else {
                return false;
            };
            let (value, close) = (&rest[..close], &rest[close + 1..]);
            tag(open)
                && close.first() == Some(&b'/')
                && close[1..] == *open
                && value.len() <= 12
                && !value.contains(&b'<')
        }
    }
}

/// Whether a masked result says nothing but how its command exited: every line of it is
/// empty, a harness's label ([`is_label_line`]), or only an exit code (`exit code 1`, `Error:
/// Exit code 1`, `Command failed with exit status 2`). Lines are read up to 8.
pub(super) fn says_nothing(masked: &str) -> bool {
    masked.len() <= 512
        && masked
            .lines()
            .take(9)
            .map(str::trim)
            .filter(|l| !l.is_empty() && !is_label_line(l))
            .all(is_exit_line)
        && masked.lines().nth(8).is_none()
}

/// Whether a line only says how a command exited.
fn is_exit_line(line: &str) -> bool {
    if line.len() > 80 {
        return false;
    }
    let lower = line.to_ascii_lowercase().replace("<n>", "0");
    let mut rest = lower.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    for prefix in [
        "error", "command", "process", "failed", "exited", "with", "the",
    ] {
        rest = rest.strip_prefix(prefix).map_or(rest, |r| {
            r.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        });
    }
    let Some(after) = [
        "exit code",
        "exit status",
        "exit_code",
        "exitcode",
        "returncode",
        "code",
    ]
    .iter()
    .find_map(|p| rest.strip_prefix(p)) else {
        return false;
    };
    !after.bytes().any(|b| b.is_ascii_alphabetic()) && after.bytes().any(|b| b.is_ascii_digit())
}

/// Whether a line only names an id (`Call id: call_3`, `request-id = 7f3a`, `Trace ID: …`): a
/// harness's label of the attempt, not part of what failed, so no signature line.
fn is_id_line(line: &str) -> bool {
    if line.len() > 200 {
        return false;
    }
    // The first `:` or `=` (ASCII: a character boundary).
    let Some(at) = memchr::memchr2(b':', b'=', line.as_bytes()) else {
        return false;
    };
    let (label, value) = (line[..at].trim(), line[at + 1..].trim());
    if label.len() > 40 || value.is_empty() || value.contains(char::is_whitespace) {
        return false;
    }
    let mut words = label.split(|c: char| c.is_whitespace() || c == '-' || c == '_');
    words
        .next_back()
        .is_some_and(|w| w.eq_ignore_ascii_case("id"))
        && words.count() <= 2
}

/// `masked` without a first or last line that only names an id ([`is_id_line`]): a harness
/// that labels each output with its call's id (`Call id: call_3`) changes nothing else.
pub(super) fn without_id_ends(masked: &str) -> &str {
    let mut text = masked;
    if let Some((first, rest)) = text.split_once('\n')
        && is_id_line(first.trim())
    {
        text = rest.trim_start();
    }
    if let Some((rest, last)) = text.rsplit_once('\n')
        && is_id_line(last.trim())
    {
        text = rest.trim_end();
    }
    text
}

/// Hashes a line of an error with its quoted parts as `<q>`: an error that echoes what it was
/// given (`old_str \`x\` did not appear`, `No order with id 'ORD-1'`) is the same error for
/// other input. An apostrophe inside a word (`doesn't`) is not a quote. A quoted token of
/// syntax (at most [`SYNTAX_TOKEN`] bytes, no letter or digit: `unmatched ']'`, `expected
/// ':'`) is kept: it names which error it is, not what the call was given.
fn signature_line(h: &mut StreamHasher, line: &[u8]) {
    let mut i = 0;
    let mut from = 0;
    while i < line.len() {
        let q = line[i];
        let opens =
            matches!(q, b'\'' | b'"' | b'`') && (i == 0 || !line[i - 1].is_ascii_alphanumeric());
        if opens && let Some(len) = line[i + 1..].iter().take(200).position(|&c| c == q) {
            // A token of syntax stays as it is written, its closing quote with it.
            if !is_syntax_token(&line[i + 1..i + 1 + len]) {
                h.bytes(&line[from..i]);
                h.bytes(b"<q>");
                from = i + len + 2;
            }
            i += len + 2;
            continue;
        }
        i += 1;
    }
    h.bytes(&line[from..]);
}

/// The longest quoted token of syntax an error's signature keeps ([`signature_line`]).
const SYNTAX_TOKEN: usize = 3;

/// Whether a quoted part is a token of syntax: a few bytes of punctuation (no letter, digit or
/// `_`, which spell names), spaces around them allowed.
fn is_syntax_token(quoted: &[u8]) -> bool {
    let token = |c: &u8| c.is_ascii_punctuation() && *c != b'_';
    quoted.len() <= SYNTAX_TOKEN
        && quoted.iter().all(|c| token(c) || *c == b' ')
        && quoted.iter().any(token)
}

/// Results with this many lines or more have their first and last lines compared with every
/// run of digits folded into one: a harness wraps output in a header or footer of counters and
/// timings (`[exec #7 exit=0 elapsed=0.01s]`, `read 3× this session · 0.4 ms`) that is noise,
/// while the numbers inside the output are its news.
const FOLD_ENDS_LINES: usize = 6;

/// The digest of a masked, trimmed result (see [`FOLD_ENDS_LINES`]).
fn digest_folding_ends(masked: &str) -> u64 {
    let bytes = masked.as_bytes();
    let newlines = memchr::memchr_iter(b'\n', bytes)
        .take(FOLD_ENDS_LINES - 1)
        .count();
    if newlines + 1 < FOLD_ENDS_LINES {
        return hash_bytes(0, bytes);
    }
    let first_end = masked.find('\n').unwrap_or(masked.len());
    let last_start = masked.rfind('\n').map_or(0, |i| i + 1).max(first_end);
    let mut h = StreamHasher::new();
    fold_digits(&mut h, &bytes[..first_end]);
    h.bytes(&bytes[first_end..last_start]);
    fold_digits(&mut h, &bytes[last_start..]);
    h.finish()
}

/// Hashes `text` with each run of ASCII digits as one `0`.
fn fold_digits(h: &mut StreamHasher, text: &[u8]) {
    let mut from = 0;
    let mut i = 0;
    while i < text.len() {
        if text[i].is_ascii_digit() {
            h.bytes(&text[from..i]);
            h.byte(b'0');
            while i < text.len() && text[i].is_ascii_digit() {
                i += 1;
            }
            from = i;
        } else {
            i += 1;
        }
    }
    h.bytes(&text[from..]);
}

/// Masks `s` with the enabled maskers, in one pass (the tests' view of [`mask::mask_into`]).
#[cfg(test)]
pub fn mask(m: &Maskers, s: &str) -> String {
    let mut buf = Vec::new();
    let mut out = out::Out::new(&mut buf);
    mask::mask_into(m, s, &mut out);
    String::from_utf8(out.written().to_vec()).unwrap_or_default()
}
