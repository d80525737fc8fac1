//! loopguard plugin `results`: different calls, same outcome. The same error text from varied
//! arguments, the same empty result from different searches, the same output again and again:
//! the agent is changing what it asks but learning nothing new.
//!
//! # How it decides
//!
//! Each tool result is normalized, then remembered as a compact sketch, never as text:
//!
//! - **text**: ANSI escape sequences dropped; timestamps (`2024-05-01T12:00:00Z`, `12:00:01`),
//!   hex ids (UUIDs, hashes, `0x…`, any run of ≥ 8 hex digits with a digit in it) masked; with
//!   `mask_numbers`, every run of digits masked; whitespace collapsed;
//! - **JSON** (an output that parses as an object or array): keys sorted, the values of volatile
//!   keys (`id`, `*_id`, `*Id`, `uuid`, `etag`, `*_at`, `timestamp`, `time`, `date`, `duration`,
//!   `elapsed`, `took`, …) masked, strings normalized as text, numbers masked with `mask_numbers`;
//! - the **sketch**: a 64-bit digest of the normalized form (and of the error flag), plus a
//!   16-slot MinHash of its word 3-shingles. Two results are as similar as their MinHashes agree
//!   (1.0 when the digests are equal).
//!
//! A result at least `similarity` similar to an earlier result of the same tool joins that
//! result's group; a failure only joins a failure naming the same error (the first line that
//! names an error type, such as `SyntaxError:`, or starts as `error:` does), so a linter's
//! reports of different errors around the same echoed proposal are different outcomes. When a group holds `min_count` results within the session's last `window`
//! results, coming from at least two different calls (exact repeats of one call are the built-in
//! detectors' business), the plugin reports a detection whose key is the group's.
//!
//! By default (`failures_only`) only failed or empty results are counted: a fixed
//! acknowledgement (`ok`, "The file has been updated") repeats in healthy work. With
//! `failures_only: false`, list tools whose normal answer is such an acknowledgement in
//! `ignore_tools`.
//!
//! # Bounded cost
//!
//! Only the first `max_bytes` bytes of an output are read (default 64 KiB), so the time per
//! event is linear in `min(output, max_bytes)` plus `window` sketch comparisons. Memory per
//! session is `window` entries of 112 bytes, whatever the outputs' sizes, for at most
//! `max_sessions` sessions (the least recently seen is forgotten first).
//!
//! # Configuration
//!
//! | key            | default | meaning                                                     |
//! |----------------|---------|-------------------------------------------------------------|
//! | `min_count`    | 3       | similar results (this one included) that make a loop        |
//! | `empty_min_count` | 5    | the same for empty answers (no error): finding nothing under a few names is search |
//! | `window`       | 10      | how many recent results of the session are looked at        |
//! | `similarity`   | 0.9     | MinHash agreement (0–1] at which two results are the same   |
//! | `mask_numbers` | true    | mask every number before comparing                          |
//! | `max_bytes`    | 65536   | bytes of each output that are read                          |
//! | `max_sessions` | 1024    | sessions remembered at once                                 |
//! | `ignore_tools` | `[]`    | tools whose results are never compared                      |
//! | `failures_only`| true    | count only failed or empty results (successes repeat legitimately) |

#![warn(missing_docs)]

use std::collections::VecDeque;

use loopguard_hash::splitmix as mix;
use loopguard_plugin_sdk::{Detection, Detector, Event, EventKind, Sessions, export_plugin};
use serde_json::Value;

/// An empty answer: nothing, an empty container, or a short "no results" sentence.
fn empty(normalized: &str) -> bool {
    let t = normalized.trim().trim_end_matches('.').to_ascii_lowercase();
    if t.len() > 64 {
        return false;
    }
    matches!(
        t.as_str(),
        "" | "[]" | "{}" | "null" | "none" | "nothing found" | "not found"
    ) || [
        "no results",
        "no matches",
        "no files",
        "no entries",
        "no items",
        "0 results",
        "0 matches",
    ]
    .iter()
    .any(|p| t.starts_with(p))
}

/// MinHash slots per sketch.
pub const SLOTS: usize = 16;

/// The plugin's configuration (see the crate docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Similar results (this one included) that make a loop.
    pub min_count: usize,
    /// How many recent results of the session are looked at.
    pub window: usize,
    /// MinHash agreement (0–1] at which two results are the same.
    pub similarity: f64,
    /// Similar empty answers (no error, this one included) that make a loop: looking for
    /// something under a few names before finding it is search.
    pub empty_min_count: usize,
    /// Mask every number before comparing.
    pub mask_numbers: bool,
    /// Bytes of each output that are read.
    pub max_bytes: usize,
    /// Sessions remembered at once.
    pub max_sessions: usize,
    /// Tools whose results are never compared.
    pub ignore_tools: Vec<String>,
    /// Count only failed or empty results (successful answers repeat legitimately: `ok`,
    /// "The file has been updated").
    pub failures_only: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_count: 3,
            empty_min_count: 5,
            window: 10,
            similarity: 0.9,
            mask_numbers: true,
            max_bytes: 64 * 1024,
            max_sessions: 1024,
            ignore_tools: Vec::new(),
            failures_only: true,
        }
    }
}

impl Config {
    /// Reads a configuration already validated against [`Results::config_schema`], and checks
    /// what the schema cannot.
    pub fn from_json(config: &Value) -> Result<Config, String> {
        let mut c = Config::default();
        let usize_of = |key: &str, default: usize| -> Result<usize, String> {
            match config.get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| format!("`{key}` must be a non-negative integer, got `{v}`")),
            }
        };
        c.min_count = usize_of("min_count", c.min_count)?;
        c.empty_min_count = usize_of("empty_min_count", c.empty_min_count)?;
        c.window = usize_of("window", c.window)?;
        c.max_bytes = usize_of("max_bytes", c.max_bytes)?;
        c.max_sessions = usize_of("max_sessions", c.max_sessions)?;
        if let Some(v) = config.get("similarity").and_then(Value::as_f64) {
            c.similarity = v;
        }
        if let Some(v) = config.get("mask_numbers").and_then(Value::as_bool) {
            c.mask_numbers = v;
        }
        if let Some(v) = config.get("failures_only").and_then(Value::as_bool) {
            c.failures_only = v;
        }
        if let Some(tools) = config.get("ignore_tools").and_then(Value::as_array) {
            c.ignore_tools = tools
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
        }
        if !(c.similarity > 0.0 && c.similarity <= 1.0) {
            return Err(format!(
                "`similarity` must be in (0, 1], got {}",
                c.similarity
            ));
        }
        for (key, n) in [
            ("min_count", c.min_count),
            ("empty_min_count", c.empty_min_count),
        ] {
            if n < 2 {
                return Err(format!("`{key}` must be at least 2, got {n}"));
            }
            if n > c.window {
                return Err(format!(
                    "`{key}` ({n}) must not exceed `window` ({}): no loop could ever be seen",
                    c.window
                ));
            }
        }
        if c.max_bytes == 0 || c.max_sessions == 0 {
            return Err("`max_bytes` and `max_sessions` must be at least 1".to_string());
        }
        Ok(c)
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization

/// Drops ANSI escape sequences (CSI, OSC, and two-character escapes).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                // CSI: parameters and intermediates, then one final byte in '@'..='~'.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                // OSC: until BEL or ESC '\'.
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' {
                        chars.next_if_eq(&'\\');
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | ':' | '.' | '+')
}

/// How one word is masked.
fn mask_word(word: &str, mask_numbers: bool, out: &mut String) {
    let word_trimmed = word.trim_end_matches(['.', ':', '-', '+']);
    let tail = &word[word_trimmed.len()..];
    let w = word_trimmed;
    let has_digit = w.bytes().any(|b| b.is_ascii_digit());
    if has_digit {
        let separators = w.bytes().filter(|b| matches!(b, b'-' | b':')).count();
        let timestamp_chars = w
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b':' | b'.' | b'T' | b'Z' | b'+'));
        if separators >= 2 && timestamp_chars && w.as_bytes()[0].is_ascii_digit() {
            out.push_str("<ts>");
            out.push_str(tail);
            return;
        }
        let hex = w.strip_prefix("0x").unwrap_or(w);
        let hex_digits = hex.bytes().filter(u8::is_ascii_hexdigit).count();
        let all_hex = hex.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        let prefixed = hex.len() < w.len() && !hex.is_empty();
        let has_hex_letter = hex.bytes().any(|b| b.is_ascii_alphabetic());
        if all_hex && (prefixed || (hex_digits >= 8 && (has_hex_letter || hex_digits >= 16))) {
            out.push_str("<id>");
            out.push_str(tail);
            return;
        }
    }
    if mask_numbers && has_digit {
        let mut in_digits = false;
        for c in w.chars() {
            if c.is_ascii_digit() {
                if !in_digits {
                    out.push('#');
                }
                in_digits = true;
            } else {
                in_digits = false;
                out.push(c);
            }
        }
    } else {
        out.push_str(w);
    }
    out.push_str(tail);
}

/// Normalized text: words masked, punctuation kept as separate tokens, one space between tokens.
fn normalize_text(s: &str, mask_numbers: bool) -> String {
    let clean = strip_ansi(s);
    let mut out = String::with_capacity(clean.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if !word.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            mask_word(word, mask_numbers, out);
            word.clear();
        }
    };
    for c in clean.chars() {
        if is_word_char(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            if !c.is_whitespace() && !c.is_control() {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push(c);
            }
        }
    }
    flush(&mut word, &mut out);
    out
}

fn is_volatile_key(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    matches!(
        lower.as_str(),
        "id" | "uuid"
            | "guid"
            | "etag"
            | "timestamp"
            | "time"
            | "date"
            | "created"
            | "updated"
            | "modified"
            | "duration"
            | "elapsed"
            | "took"
            | "nonce"
            | "cursor"
    ) || lower.ends_with("_id")
        || lower.ends_with("_at")
        || lower.ends_with("_ms")
        || lower.ends_with("_time")
        || lower.ends_with("_timestamp")
        || (key.len() > 2 && key.ends_with("Id"))
}

/// Canonical JSON: keys sorted, volatile values masked, strings normalized.
fn canonical_json(v: &Value, mask_numbers: bool, out: &mut String) {
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) => {
            if mask_numbers {
                out.push('#');
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => {
            out.push('"');
            out.push_str(&normalize_text(s, mask_numbers));
            out.push('"');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                canonical_json(item, mask_numbers, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                out.push_str(k);
                out.push_str(" : ");
                if is_volatile_key(k) {
                    out.push_str("<v>");
                } else {
                    canonical_json(&map[k.as_str()], mask_numbers, out);
                }
            }
            out.push('}');
        }
    }
}

/// The normalized form of an output, reading at most `max_bytes` bytes of it.
pub fn normalize(output: &str, mask_numbers: bool, max_bytes: usize) -> String {
    let mut end = output.len().min(max_bytes);
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    let head = &output[..end];
    let trimmed = head.trim_start();
    let looks_like_json = trimmed.starts_with('{') || trimmed.starts_with('[');
    if end == output.len()
        && looks_like_json
        && let Ok(v) = serde_json::from_str::<Value>(head)
    {
        let mut out = String::new();
        canonical_json(&v, mask_numbers, &mut out);
        return out;
    }
    normalize_text(head, mask_numbers)
}

/// Whether a line names an error: an error type (`SyntaxError:`, `java.io.IOException`: a word
/// ending in `Error` or `Exception` after a letter) or a compiler's `error:` / `error[…]` start.
fn names_error(line: &str) -> bool {
    let t = line.trim_start();
    if t.starts_with("error:") || t.starts_with("error[") {
        return true;
    }
    ["Error", "Exception"].iter().any(|suffix| {
        t.match_indices(suffix).any(|(at, _)| {
            t[..at].chars().next_back().is_some_and(char::is_alphabetic)
                && !t[at + suffix.len()..]
                    .chars()
                    .next()
                    .is_some_and(char::is_alphanumeric)
        })
    })
}

/// Lines of an output searched for the error it names.
const NAMED_ERROR_LINES: usize = 200;

/// A hash of the first line of a failed output that names an error (0: none), normalized: two
/// failures naming different errors are different failures, however alike the rest of the two
/// outputs (a linter's report around the agent's own proposal echoed back whole).
fn named_error(output: &str, mask_numbers: bool, max_bytes: usize) -> u64 {
    let mut end = output.len().min(max_bytes);
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    output[..end]
        .lines()
        .take(NAMED_ERROR_LINES)
        .filter(|l| l.len() <= 1000)
        .map(strip_ansi)
        .find(|l| names_error(l))
        .map_or(0, |l| {
            fnv(normalize_text(&without_quoted(&l), mask_numbers).as_bytes()) | 1
        })
}

/// A line with its quoted parts (`'x'`, `"x"`, `` `x` ``, up to 200 bytes, opened where no
/// letter or digit comes before) as `<q>`: an error that echoes what it was given is the same
/// error for other input. A quoted token of syntax (a few bytes of punctuation: `unmatched
/// ']'`) is kept: it names which error it is, as the engine's failure signature keeps it.
fn without_quoted(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let (mut i, mut from) = (0, 0);
    while i < b.len() {
        let q = b[i];
        let opens =
            matches!(q, b'\'' | b'"' | b'`') && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
        if opens && let Some(len) = b[i + 1..].iter().take(200).position(|&c| c == q) {
            if !is_syntax_token(&b[i + 1..i + 1 + len]) {
                out.push_str(&line[from..i]);
                out.push_str("<q>");
                from = i + len + 2;
            }
            i += len + 2;
            continue;
        }
        i += 1;
    }
    out.push_str(&line[from..]);
    out
}

/// Whether a quoted part is a token of syntax: at most three bytes of punctuation (no letter,
/// digit or `_`, which spell names), spaces around them allowed.
fn is_syntax_token(quoted: &[u8]) -> bool {
    let token = |c: &u8| c.is_ascii_punctuation() && *c != b'_';
    quoted.len() <= 3 && quoted.iter().all(|c| token(c) || *c == b' ') && quoted.iter().any(token)
}

// ---------------------------------------------------------------------------------------------
// Sketches

/// A token's hash: FNV-1a, spread by [`mix`].
fn fnv(bytes: &[u8]) -> u64 {
    mix(loopguard_hash::fnv1a(bytes))
}

/// A result, remembered without its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sketch {
    /// Hash of the whole normalized output (equal outputs: equal digests).
    pub digest: u64,
    /// The output's MinHash signature over its tokens.
    pub minhash: [u32; SLOTS],
}

impl Sketch {
    /// The sketch of an already normalized output.
    pub fn of(normalized: &str, is_error: bool) -> Sketch {
        let digest = mix(fnv(normalized.as_bytes()) ^ u64::from(is_error));
        let mut minhash = [u32::MAX; SLOTS];
        let tokens: Vec<u64> = normalized.split(' ').map(|t| fnv(t.as_bytes())).collect();
        let mut add = |shingle: u64| {
            for (i, slot) in minhash.iter_mut().enumerate() {
                let h =
                    (mix(shingle ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 32) as u32;
                *slot = (*slot).min(h);
            }
        };
        if tokens.len() < 3 {
            add(tokens.iter().fold(0, |acc, t| mix(acc ^ t)));
        } else {
            for w in tokens.windows(3) {
                add(mix(mix(w[0] ^ 1) ^ w[1]) ^ w[2]);
            }
        }
        Sketch { digest, minhash }
    }

    /// Estimated similarity in [0, 1]: 1 for equal digests, else the share of agreeing slots.
    pub fn similarity(&self, other: &Sketch) -> f64 {
        if self.digest == other.digest {
            return 1.0;
        }
        let same = self
            .minhash
            .iter()
            .zip(&other.minhash)
            .filter(|(a, b)| a == b)
            .count();
        same as f64 / SLOTS as f64
    }
}

// ---------------------------------------------------------------------------------------------
// The detector

#[derive(Debug)]
struct Entry {
    tool: u64,
    /// Identifies the call (exact fingerprint, else a hash of the arguments; 0 if unknown).
    call: u64,
    group: u64,
    sketch: Sketch,
    /// The error a failure names ([`named_error`]; 0 for none and for successes).
    named: u64,
    /// A failed or empty result.
    bad: bool,
    /// Its call was decided together with the previous one (one assistant message).
    batched: bool,
}

#[derive(Debug, Default)]
struct Session {
    entries: VecDeque<Entry>,
}

/// The detector.
#[derive(Debug)]
pub struct Results {
    config: Config,
    sessions: Sessions<Session>,
}

impl Results {
    /// A detector with `config`.
    pub fn with_config(config: Config) -> Results {
        Results {
            sessions: Sessions::new(config.max_sessions),
            config,
        }
    }

    fn on_result(&mut self, ev: &Event<'_>) -> Option<Detection> {
        if self.config.ignore_tools.iter().any(|t| t == ev.tool) {
            return None;
        }
        let (min_count, window, threshold) = (
            self.config.min_count,
            self.config.window,
            self.config.similarity,
        );
        let normalized = normalize(ev.result, self.config.mask_numbers, self.config.max_bytes);
        let sketch = Sketch::of(&normalized, ev.is_error);
        let tool = fnv(ev.tool.as_bytes());
        let call = if ev.exact != 0 {
            ev.exact
        } else if !ev.arguments.is_empty() {
            fnv(ev.arguments.as_bytes())
        } else {
            0
        };
        // A shell command printing nothing succeeded quietly (`git add`, `mkdir`): not an empty
        // answer; one that found nothing says so by its exit code.
        let failed = ev.is_error || ev.exit_code.is_some_and(|c| c != 0);
        let named = if failed {
            named_error(ev.result, self.config.mask_numbers, self.config.max_bytes)
        } else {
            0
        };
        let session = self.sessions.get(ev.session);

        let mut best: Option<(f64, u64)> = None;
        for e in session
            .entries
            .iter()
            .filter(|e| e.tool == tool && e.named == named)
        {
            let s = e.sketch.similarity(&sketch);
            if s >= threshold && best.is_none_or(|(b, _)| s > b) {
                best = Some((s, e.group));
            }
        }
        let group = best.map_or_else(|| mix(sketch.digest ^ tool), |b| b.1);
        if session.entries.len() >= window {
            session.entries.pop_front();
        }
        // So did a write or a click that reports nothing.
        let bad = failed || (!ev.is_shell && !ev.changes && empty(&normalized));
        session.entries.push_back(Entry {
            tool,
            call,
            group,
            sketch,
            named,
            bad,
            batched: ev.batched,
        });
        if self.config.failures_only && !bad {
            return None;
        }
        let failures_only = self.config.failures_only;
        let member = |e: &Entry| e.group == group && (e.bad || !failures_only);
        let members = session.entries.iter().filter(|e| member(e));
        // Calls decided together (one assistant message) are one try: a member counts unless
        // it was made with the previous result's call and that one is a member too.
        let mut count = 0usize;
        let mut previous_member = false;
        for e in &session.entries {
            let m = member(e);
            if m && !(e.batched && previous_member) {
                count += 1;
            }
            previous_member = m;
        }
        // Calls the host could not identify (0) count as different ones.
        let different_calls = members.clone().any(|e| e.call == 0 || e.call != call);
        let needed = if bad && !failed {
            self.config.empty_min_count
        } else {
            min_count
        };
        if count < needed || !different_calls {
            return None;
        }
        let what = if ev.is_error { "error" } else { "result" };
        let preview: String = normalized.chars().take(60).collect();
        let preview = if preview.is_empty() {
            "(empty)".to_string()
        } else if normalized.chars().nth(60).is_some() {
            format!("{preview}…")
        } else {
            preview
        };
        Some(Detection {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            key: group,
            message: format!(
                "`{}` returned the same {what} {count} times in the last {} results, for different \
                 arguments; varying the call is not changing the outcome",
                ev.tool,
                session.entries.len()
            ),
            pattern: format!("{} → same {what}: {preview}", ev.tool),
        })
    }
}

impl Detector for Results {
    fn name() -> &'static str {
        "results"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> Value {
        serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "loopguard results plugin",
            "type": ["object", "null"],
            "additionalProperties": false,
            "properties": {
                "min_count": {
                    "type": "integer", "minimum": 2, "default": 3,
                    "description": "similar results, this one included, that make a loop"
                },
                "empty_min_count": {
                    "type": "integer", "minimum": 2, "maximum": 1000, "default": 5,
                    "description": "similar empty answers (no error) that make a loop: finding nothing under a few names is search"
                },
                "window": {
                    "type": "integer", "minimum": 2, "maximum": 1000, "default": 10,
                    "description": "recent results of the session that are compared"
                },
                "similarity": {
                    "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.9,
                    "description": "MinHash agreement at which two results count as the same"
                },
                "mask_numbers": {
                    "type": "boolean", "default": true,
                    "description": "mask every number before comparing"
                },
                "max_bytes": {
                    "type": "integer", "minimum": 1, "default": 65536,
                    "description": "bytes of each output that are read"
                },
                "max_sessions": {
                    "type": "integer", "minimum": 1, "default": 1024,
                    "description": "sessions remembered at once"
                },
                "ignore_tools": {
                    "type": "array", "items": { "type": "string" }, "default": [],
                    "description": "tools whose results are never compared"
                },
                "failures_only": {
                    "type": "boolean", "default": true,
                    "description": "count only failed or empty results; successful answers repeat legitimately"
                }
            }
        })
    }

    fn new(config: Value) -> Result<Self, String> {
        Ok(Results::with_config(Config::from_json(&config)?))
    }

    // Its state is per session: sessions are spread over instances with their own locks, so
    // one session's event never waits for another shard's.
    const SESSION_SHARDS: usize = 16;

    /// Each shard remembers its share of `max_sessions`.
    fn new_shard(config: Value, shards: usize) -> Result<Self, String> {
        let mut c = Config::from_json(&config)?;
        c.max_sessions = c.max_sessions.div_ceil(shards.max(1));
        Ok(Results::with_config(c))
    }

    fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
        match ev.kind {
            EventKind::Result => self.on_result(ev),
            EventKind::Reset => {
                self.sessions.remove(ev.session);
                None
            }
            _ => None,
        }
    }
}

export_plugin!(Results);

#[cfg(test)]
mod tests {
    use super::*;

    fn result<'a>(tool: &'a str, output: &'a str, exact: u64) -> Event<'a> {
        let mut ev = Event::new(EventKind::Result, "s");
        ev.tool = tool;
        ev.result = output;
        ev.exact = exact;
        ev
    }

    fn detector() -> Results {
        Results::new(Value::Null).unwrap()
    }

    #[test]
    fn writes_that_report_nothing_are_no_empty_answers() {
        let mut d = detector();
        for exact in 1..=7 {
            let mut ev = result("write_file", "", exact);
            ev.changes = true;
            assert!(d.on_event(&ev).is_none(), "{exact}");
        }
    }

    #[test]
    fn five_searches_with_the_same_empty_result() {
        let mut d = detector();
        for exact in 1..=4 {
            assert!(
                d.on_event(&result("search", "[]", exact)).is_none(),
                "{exact}"
            );
        }
        let hit = d.on_event(&result("search", "[]", 5)).expect("a loop");
        assert_eq!(hit.count, 5);
        assert!(hit.message.contains("`search`"), "{}", hit.message);
        // Failures count from `min_count`.
        let mut d = detector();
        let mut failed = |exact| {
            let mut ev = result("search", "index unavailable", exact);
            ev.is_error = true;
            d.on_event(&ev)
        };
        assert!(failed(1).is_none() && failed(2).is_none());
        assert_eq!(failed(3).expect("a loop").count, 3);
        // The empty count is configurable.
        let mut d = Results::new(serde_json::json!({"empty_min_count": 2})).unwrap();
        assert!(d.on_event(&result("search", "[]", 1)).is_none());
        assert!(d.on_event(&result("search", "[]", 2)).is_some());
    }

    /// Searches sent together in one assistant message were decided before any came back:
    /// however many find nothing, they are one try.
    #[test]
    fn calls_of_one_message_are_one_try() {
        let mut d = detector();
        for exact in 1..=6 {
            let mut ev = result("grep", "No matches found.", exact);
            ev.batched = exact > 1;
            assert!(d.on_event(&ev).is_none(), "search {exact}");
        }
        // Four more, each after the previous one's answer: five tries in all.
        let hits: Vec<_> = (7..=10)
            .map(|exact| d.on_event(&result("grep", "No matches found.", exact)))
            .collect();
        assert!(hits[2].is_none() && hits[3].is_some(), "{hits:?}");
        assert_eq!(hits[3].as_ref().unwrap().count, 5);
    }

    /// `git add`, `mkdir` and `git diff --check` print nothing when they succeed: three
    /// different silent commands were three "empty answers" in a row.
    #[test]
    fn silent_shell_commands_are_not_empty_answers() {
        let mut d = detector();
        for exact in 1..=5 {
            let mut ev = result("bash", "", exact);
            ev.is_shell = true;
            assert!(d.on_event(&ev).is_none(), "command {exact}");
        }
        // A shell command that found nothing says so by its exit code.
        let mut last = None;
        for exact in 6..=8 {
            let mut ev = result("bash", "", exact);
            ev.is_shell = true;
            ev.exit_code = Some(1);
            last = d.on_event(&ev);
        }
        assert!(last.is_some());
    }

    /// A linter's rejection: the error it found, then the proposal echoed back whole.
    fn rejection(error: &str, revision: usize) -> String {
        const WORDS: [&str; 12] = [
            "values", "weights", "total", "scale", "offset", "rows", "columns", "buffer", "header",
            "footer", "cursor", "limit",
        ];
        // Forty different lines (line numbers are masked, so the words must differ).
        let echoed: String = (0..40)
            .map(|n| {
                let (a, b, c) = (
                    WORDS[n % 12],
                    WORDS[(n / 12 + 5) % 12],
                    WORDS[(n * 7 + 1) % 12],
                );
                format!("{n}:    {a} = merge_{b}({c}, {a}.{b})\n")
            })
            .collect();
        format!(
            "Your proposed edit has introduced new syntax error(s).\nERRORS:\n- {error}\n\
             This is how your edit would have looked if applied\n{echoed}# revision {revision}\n\
             Your changes have NOT been applied. Please fix your edit command and try again."
        )
    }

    #[test]
    fn failures_naming_other_errors_are_other_outcomes() {
        let run = |errors: &[&str]| {
            let mut d = detector();
            let mut last = None;
            for (i, error) in errors.iter().enumerate() {
                let out = rejection(error, i);
                let mut ev = result("edit", &out, i as u64 + 1);
                ev.is_error = true;
                last = d.on_event(&ev);
            }
            last
        };
        assert!(
            run(&[
                "E999 SyntaxError: '(' was never closed",
                "F821 undefined name 're'",
                "E999 IndentationError: unexpected indent",
            ])
            .is_none()
        );
        // The same error for other input (quoted parts) is one outcome.
        assert!(
            run(&[
                "F821 undefined name 'total'",
                "F821 undefined name 'totals'",
                "F821 undefined name 'sum_total'",
            ])
            .is_some()
        );
        // The token of syntax a parser quotes names which error it is.
        assert!(
            run(&[
                "E999 SyntaxError: '(' was never closed",
                "E999 SyntaxError: '[' was never closed",
                "E999 SyntaxError: '{' was never closed",
            ])
            .is_none()
        );
    }

    #[test]
    fn same_error_with_volatile_parts() {
        let mut d = detector();
        let outputs = [
            "\u{1b}[31merror\u{1b}[0m: request 550e8400-e29b-41d4-a716-446655440000 failed at 2024-05-01T12:00:00Z (attempt 1)",
            "error: request 6ba7b810-9dad-11d1-80b4-00c04fd430c8 failed at 2024-05-01T12:00:07Z (attempt 2)",
            "error:  request 6ba7b811-9dad-11d1-80b4-00c04fd430c8 failed at 2024-05-01T12:01:00Z (attempt 3)",
        ];
        let mut last = None;
        for (i, o) in outputs.iter().enumerate() {
            let mut ev = result("fetch", o, i as u64 + 1);
            ev.is_error = true;
            last = d.on_event(&ev);
        }
        let hit = last.expect("a loop");
        assert!(hit.message.contains("same error"), "{}", hit.message);
    }

    #[test]
    fn json_results_compare_structurally() {
        let a = normalize(
            r#"{"items": [], "request_id": "abc", "took": 12}"#,
            true,
            1 << 16,
        );
        let b = normalize(
            r#"{"took": 7, "items": [], "request_id": "xyz"}"#,
            true,
            1 << 16,
        );
        assert_eq!(a, b);
        let c = normalize(r#"{"items": [1], "took": 7}"#, true, 1 << 16);
        assert_ne!(a, c);
    }

    #[test]
    fn numbers_are_masked_only_when_asked() {
        assert_eq!(normalize("found 12 files", true, 100), "found # files");
        assert_eq!(normalize("found 12 files", false, 100), "found 12 files");
        assert_eq!(
            normalize("at 12:00:01 on 2024-01-02", false, 100),
            "at <ts> on <ts>"
        );
        assert_eq!(normalize("commit 3f2a9c1e0b", false, 100), "commit <id>");
        assert_eq!(normalize("ptr 0x7ffd", false, 100), "ptr <id>");
    }

    #[test]
    fn exact_repeats_are_left_to_the_built_in_detectors() {
        let mut d = detector();
        for _ in 0..5 {
            assert!(d.on_event(&result("search", "[]", 9)).is_none());
        }
    }

    #[test]
    fn different_results_are_not_a_loop() {
        let mut d = detector();
        for (i, o) in [
            "alpha beta gamma",
            "delta epsilon zeta",
            "eta theta iota",
            "kappa lambda mu",
        ]
        .iter()
        .enumerate()
        {
            assert!(d.on_event(&result("search", o, i as u64)).is_none());
        }
    }

    #[test]
    fn near_same_long_outputs_match() {
        let base: String = (0..200)
            .map(|i| format!("line {i} of the report says ok\n"))
            .collect();
        let changed = base.replace("line 7 of", "line seven of");
        let a = Sketch::of(&normalize(&base, false, 1 << 16), false);
        let b = Sketch::of(&normalize(&changed, false, 1 << 16), false);
        assert!(a.similarity(&b) >= 0.75, "{}", a.similarity(&b));
        let c = Sketch::of("something else entirely , nothing alike here", false);
        assert!(a.similarity(&c) < 0.2);
    }

    /// A fixed acknowledgement from different calls ("The file has been updated.") is healthy
    /// work; counted only when `failures_only` is off.
    #[test]
    fn successful_answers_are_not_counted_by_default() {
        let mut d = detector();
        for i in 0..6 {
            assert!(
                d.on_event(&result("edit", "The file has been updated.", i + 1))
                    .is_none()
            );
        }
        let mut d = Results::new(serde_json::json!({"failures_only": false})).unwrap();
        let hits: Vec<_> = (0..3)
            .map(|i| d.on_event(&result("edit", "The file has been updated.", i + 1)))
            .collect();
        assert!(hits[2].is_some(), "{hits:?}");
        // Empty results count as failures (from `empty_min_count`).
        let mut d = detector();
        let hits: Vec<_> = (0..5)
            .map(|i| d.on_event(&result("grep", "No matches found.", i + 1)))
            .collect();
        assert!(hits[3].is_none() && hits[4].is_some(), "{hits:?}");
    }

    #[test]
    fn ignored_tools_are_skipped() {
        let mut d = Results::new(serde_json::json!({"ignore_tools": ["write"]})).unwrap();
        for i in 0..5 {
            assert!(d.on_event(&result("write", "ok", i)).is_none());
        }
    }

    #[test]
    fn memory_does_not_grow_with_output_size() {
        let mut d =
            Results::new(serde_json::json!({"max_bytes": 1024, "window": 4, "min_count": 2, "empty_min_count": 2}))
                .unwrap();
        let huge = "z".repeat(10 << 20);
        for i in 0..10 {
            d.on_event(&result("cat", &huge, i));
        }
        let s = d.sessions.peek("s").unwrap();
        assert_eq!(s.entries.len(), 4);
        assert_eq!(std::mem::size_of::<Entry>(), 112, "the documented bound");
    }

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[1;31mred\u{1b}[0m \u{1b}]0;title\u{7}x"),
            "red x"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(100);
        assert_eq!(normalize(&s, true, 3).chars().count(), 1);
    }

    #[test]
    fn config_is_checked() {
        assert!(Results::new(serde_json::json!({"min_count": 20})).is_err());
        assert!(Results::new(serde_json::json!({"similarity": 1.5})).is_err());
        let c = Config::from_json(&serde_json::json!({"mask_numbers": false})).unwrap();
        assert!(!c.mask_numbers);
    }
}
