//! loopguard plugin `similarity`: the same tool, called again and again with **near**-identical
//! arguments (`fo0`, `f00`, `foo ` after `foo`), which exact fingerprints cannot see.
//!
//! # How it decides
//!
//! Each call's JSON arguments are compared field by field with the earlier calls of the same tool
//! in the session's recent window:
//!
//! - strings: whitespace trimmed and collapsed, then the larger of normalized Levenshtein and
//!   Jaro-Winkler similarity (`strsim`); strings whose lengths differ by more than 2× are
//!   dissimilar without being compared;
//! - objects: the mean similarity over the union of their keys (a key on one side only counts 0),
//!   so `{"q":"foo","page":1}` and `{"q":"foo","page":2}` score 0.5: paging is not a loop;
//! - arrays: element by element, the mean over the longer one;
//! - numbers, booleans, null: equal or not.
//!
//! A call at least `threshold` similar to an earlier one joins that call's group (single linkage,
//! so a drifting retry `foo` → `fo0` → `f00` stays one group). When a result arrives and its
//! call's group holds `min_count` calls within the last `window` calls of the session whose
//! outcomes show no progress (the same result digest: for failures, the same error), and they are
//! not all exact repeats (those are the built-in detectors' business), the plugin reports a
//! detection whose key is the group's. Near-identical arguments with new results (the next file,
//! the next page) are work, not a loop.
//!
//! # Bounded cost
//!
//! Arguments are reduced once, when the call arrives, to a bounded sketch: strings keep their
//! first `max_chars` characters, containers their first 32 entries, nesting stops at depth 8, and
//! a call keeps at most `4 × max_chars` characters in all; arguments over 256 KiB are not parsed
//! as JSON but sketched as text from their start. Comparing two strings of `la` and `lb`
//! characters is charged `2 × la × lb` steps (Levenshtein and Jaro-Winkler), and each event has a
//! budget of [`MAX_STEPS_PER_EVENT`] (2²⁴ = 16,777,216) steps: once it is spent, the remaining
//! comparisons of the event count as dissimilar. Without the budget the worst case would be
//! `(window − 1) × 8 × max_chars²` steps; the schema caps `window` at 100 and `max_chars` at
//! 1,024, and with the defaults (window 10, max_chars 256) the worst case, about 4.7 million
//! steps, is within the budget, so defaults are never cut short. Typical ~200-byte arguments cost
//! far less (the length prefilter and exact-match shortcut skip most pairs). Memory is `window`
//! sketches per session (≤ `4 × max_chars` characters each), for at most `max_sessions` sessions
//! (capped at 65,536; the least recently seen is forgotten first, by a scan of the sessions of
//! its shard).
//!
//! # Configuration
//!
//! | key            | default | meaning                                           |
//! |----------------|---------|---------------------------------------------------|
//! | `threshold`    | 0.8     | similarity (0–1] at which two calls are "similar" |
//! | `min_count`    | 3       | similar calls (this one included) that make a loop |
//! | `window`       | 10      | how many recent calls of the session are looked at |
//! | `max_chars`    | 256     | characters kept per string                        |
//! | `max_sessions` | 1024    | sessions remembered at once                       |
//! | `failures_only`| true    | count only calls whose results failed             |

#![warn(missing_docs)]

use std::collections::VecDeque;

// Call, group and result keys: a stable 64-bit hash of several byte strings.
use loopguard_hash::fnv1a_fields as hash;
use loopguard_plugin_sdk::{Detection, Detector, Event, EventKind, Sessions, export_plugin};
use serde_json::Value;

const MAX_ENTRIES: usize = 32;
const MAX_DEPTH: usize = 8;

/// The steps one event may spend comparing strings (see the crate docs).
pub const MAX_STEPS_PER_EVENT: u64 = 1 << 24;
/// The largest accepted `window`.
pub const MAX_WINDOW: usize = 100;
/// The largest accepted `max_chars`.
pub const MAX_CHARS: usize = 1024;
/// The largest accepted `max_sessions`.
pub const MAX_SESSIONS: usize = 65_536;
/// Arguments longer than this are sketched as text, not parsed as JSON.
const MAX_PARSED_BYTES: usize = 256 * 1024;

/// The string-comparison steps an event may still spend.
#[derive(Debug)]
struct Steps {
    left: u64,
    /// Steps charged so far (what the tests read).
    used: u64,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            left: MAX_STEPS_PER_EVENT,
            used: 0,
        }
    }

    /// Charges `cost` steps; false (and nothing charged) when the budget cannot pay them.
    fn charge(&mut self, cost: u64) -> bool {
        if cost > self.left {
            self.left = 0;
            return false;
        }
        self.left -= cost;
        self.used += cost;
        true
    }
}

/// The plugin's configuration (see the crate docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Similarity (0–1] at which two calls are "similar".
    pub threshold: f64,
    /// Similar calls (this one included) that make a loop.
    pub min_count: usize,
    /// How many recent calls of the session are looked at.
    pub window: usize,
    /// Characters kept per string.
    pub max_chars: usize,
    /// Sessions remembered at once.
    pub max_sessions: usize,
    /// Count only calls whose results failed (near-identical successful calls are usually the
    /// next item of a batch).
    pub failures_only: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            threshold: 0.8,
            min_count: 3,
            window: 10,
            max_chars: 256,
            max_sessions: 1024,
            failures_only: true,
        }
    }
}

impl Config {
    /// Reads a configuration already validated against [`Similarity::config_schema`], and checks
    /// what the schema cannot.
    pub fn from_json(config: &Value) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = config.get("threshold").and_then(Value::as_f64) {
            c.threshold = v;
        }
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
        c.window = usize_of("window", c.window)?;
        c.max_chars = usize_of("max_chars", c.max_chars)?;
        c.max_sessions = usize_of("max_sessions", c.max_sessions)?;
        if let Some(v) = config.get("failures_only").and_then(Value::as_bool) {
            c.failures_only = v;
        }
        if !(c.threshold > 0.0 && c.threshold <= 1.0) {
            return Err(format!(
                "`threshold` must be in (0, 1], got {}",
                c.threshold
            ));
        }
        if c.min_count < 2 {
            return Err(format!(
                "`min_count` must be at least 2, got {}",
                c.min_count
            ));
        }
        if c.min_count > c.window {
            return Err(format!(
                "`min_count` ({}) must not exceed `window` ({}): no loop could ever be seen",
                c.min_count, c.window
            ));
        }
        if c.max_chars == 0 || c.max_sessions == 0 {
            return Err("`max_chars` and `max_sessions` must be at least 1".to_string());
        }
        for (key, value, max) in [
            ("window", c.window, MAX_WINDOW),
            ("max_chars", c.max_chars, MAX_CHARS),
            ("max_sessions", c.max_sessions, MAX_SESSIONS),
        ] {
            if value > max {
                return Err(format!(
                    "`{key}` must be at most {max} (it bounds the work of one event), got {value}"
                ));
            }
        }
        Ok(c)
    }
}

/// A bounded copy of a call's arguments.
#[derive(Clone, Debug, PartialEq)]
enum Sketch {
    Null,
    Bool(bool),
    Num(f64),
    Str {
        text: String,
        chars: usize,
    },
    Arr(Vec<Sketch>),
    /// Sorted by key.
    Obj(Vec<(String, Sketch)>),
}

struct Budget {
    max_chars: usize,
    chars_left: usize,
}

impl Budget {
    /// Whitespace-normalized, truncated text, charged to the budget.
    fn text(&mut self, s: &str) -> Sketch {
        let cap = self.max_chars.min(self.chars_left);
        let mut text = String::new();
        let mut chars = 0;
        for word in s.split_whitespace() {
            if chars >= cap {
                break;
            }
            if chars > 0 {
                text.push(' ');
                chars += 1;
            }
            for c in word.chars() {
                if chars >= cap {
                    break;
                }
                text.push(c);
                chars += 1;
            }
        }
        self.chars_left -= chars.min(self.chars_left);
        Sketch::Str { text, chars }
    }

    fn sketch(&mut self, v: &Value, depth: usize) -> Sketch {
        if depth >= MAX_DEPTH {
            return Sketch::Null;
        }
        match v {
            Value::Null => Sketch::Null,
            Value::Bool(b) => Sketch::Bool(*b),
            Value::Number(n) => Sketch::Num(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => self.text(s),
            Value::Array(items) => Sketch::Arr(
                items
                    .iter()
                    .take(MAX_ENTRIES)
                    .map(|i| self.sketch(i, depth + 1))
                    .collect(),
            ),
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Sketch::Obj(
                    keys.into_iter()
                        .take(MAX_ENTRIES)
                        .map(|k| (k.clone(), self.sketch(&map[k.as_str()], depth + 1)))
                        .collect(),
                )
            }
        }
    }
}

/// Reduces canonical arguments (JSON text, or raw text) to a bounded sketch.
fn sketch_arguments(arguments: &str, max_chars: usize) -> Sketch {
    let mut budget = Budget {
        max_chars,
        chars_left: max_chars.saturating_mul(4),
    };
    if arguments.len() > MAX_PARSED_BYTES {
        return budget.text(arguments);
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v) => budget.sketch(&v, 0),
        Err(_) => budget.text(arguments),
    }
}

fn string_similarity(a: &str, la: usize, b: &str, lb: usize, steps: &mut Steps) -> f64 {
    if a == b {
        return 1.0;
    }
    let (short, long) = if la < lb { (la, lb) } else { (lb, la) };
    if short * 2 < long {
        return 0.0;
    }
    // Levenshtein and Jaro-Winkler each cost up to `la × lb` character steps.
    let cost = 2u64.saturating_mul(la as u64).saturating_mul(lb as u64);
    if !steps.charge(cost) {
        return 0.0;
    }
    strsim::normalized_levenshtein(a, b).max(strsim::jaro_winkler(a, b))
}

/// Similarity in [0, 1] of two sketches (see the crate docs).
fn similarity(a: &Sketch, b: &Sketch, steps: &mut Steps) -> f64 {
    match (a, b) {
        (Sketch::Null, Sketch::Null) => 1.0,
        (Sketch::Bool(x), Sketch::Bool(y)) => f64::from(u8::from(x == y)),
        (Sketch::Num(x), Sketch::Num(y)) => f64::from(u8::from(x == y)),
        (Sketch::Str { text: x, chars: lx }, Sketch::Str { text: y, chars: ly }) => {
            string_similarity(x, *lx, y, *ly, steps)
        }
        (Sketch::Arr(x), Sketch::Arr(y)) => {
            let n = x.len().max(y.len());
            if n == 0 {
                return 1.0;
            }
            let sum: f64 = x.iter().zip(y).map(|(p, q)| similarity(p, q, steps)).sum();
            sum / n as f64
        }
        (Sketch::Obj(x), Sketch::Obj(y)) => {
            let (mut i, mut j, mut union, mut sum) = (0, 0, 0usize, 0.0);
            while i < x.len() || j < y.len() {
                union += 1;
                match (x.get(i), y.get(j)) {
                    (Some((kx, vx)), Some((ky, vy))) if kx == ky => {
                        sum += similarity(vx, vy, steps);
                        i += 1;
                        j += 1;
                    }
                    (Some((kx, _)), Some((ky, _))) if kx < ky => i += 1,
                    (Some(_), None) => i += 1,
                    _ => j += 1,
                }
            }
            if union == 0 { 1.0 } else { sum / union as f64 }
        }
        _ => 0.0,
    }
}

/// The first 80 characters of `args`, with `…` when cut.
fn preview(args: &str) -> String {
    let mut p: String = args.chars().take(80).collect();
    if args.chars().nth(80).is_some() {
        p.push('…');
    }
    p
}

#[derive(Debug)]
struct Entry {
    tool: u64,
    /// Exact fingerprint, or a hash of the arguments when the host gave none.
    exact: u64,
    group: u64,
    args: Sketch,
    /// Hash of the host's call id, to find the call when its result arrives.
    call: u64,
    /// The first 80 characters of the arguments, for the message.
    preview: String,
    /// The call's outcome once its result arrived: the engine's result digest, and whether it
    /// failed.
    outcome: Option<(u64, bool)>,
}

impl Entry {
    /// No progress between the two outcomes: the same result (for failures, the engine's
    /// digest is the error's signature, so the same error), and failed alike.
    fn same_outcome(&self, digest: u64, failed: bool) -> bool {
        self.outcome
            .is_some_and(|(d, f)| d == digest && f == failed)
    }
}

#[derive(Debug, Default)]
struct Session {
    entries: VecDeque<Entry>,
}

/// The detector.
#[derive(Debug)]
pub struct Similarity {
    config: Config,
    sessions: Sessions<Session>,
    /// String-comparison steps the latest call spent (bounded by [`MAX_STEPS_PER_EVENT`]).
    last_steps: u64,
}

impl Similarity {
    /// A detector with `config`.
    pub fn with_config(config: Config) -> Similarity {
        Similarity {
            sessions: Sessions::new(config.max_sessions),
            config,
            last_steps: 0,
        }
    }

    fn on_call(&mut self, ev: &Event<'_>) -> Option<Detection> {
        let config = self.config.clone();
        let tool = hash(&[ev.tool.as_bytes()]);
        let exact = if ev.exact != 0 {
            ev.exact
        } else {
            hash(&[ev.tool.as_bytes(), ev.arguments.as_bytes()])
        };
        let args = sketch_arguments(ev.arguments, config.max_chars);
        let session = self.sessions.get(ev.session);

        let mut best: Option<(f64, u64)> = None;
        let mut steps = Steps::new();
        for e in session.entries.iter().filter(|e| e.tool == tool) {
            let s = if e.exact == exact {
                1.0
            } else {
                similarity(&e.args, &args, &mut steps)
            };
            if s >= config.threshold && best.is_none_or(|(b, _)| s > b) {
                best = Some((s, e.group));
            }
        }
        let group = best.map_or_else(
            || hash(&[ev.tool.as_bytes(), &exact.to_le_bytes()]),
            |b| b.1,
        );

        self.last_steps = steps.used;
        if session.entries.len() >= config.window {
            session.entries.pop_front();
        }
        session.entries.push_back(Entry {
            tool,
            exact,
            group,
            args,
            call: hash(&[ev.call_id.as_bytes()]),
            preview: preview(ev.arguments),
            outcome: None,
        });
        None
    }

    /// A result arrived: its call's group is a loop when `min_count` of its calls (this one
    /// included) had no progress between their outcomes. Near-identical arguments with new
    /// results (the next file, the next page, the next function) are work, not a loop.
    fn on_result(&mut self, ev: &Event<'_>) -> Option<Detection> {
        let config = self.config.clone();
        let call = hash(&[ev.call_id.as_bytes()]);
        let session = self.sessions.get(ev.session);
        let failed = ev.is_error || ev.exit_code.is_some_and(|c| c != 0);
        let digest = if ev.result_digest != 0 {
            ev.result_digest
        } else {
            hash(&[ev.result.as_bytes()])
        };
        let entry = session.entries.iter_mut().rev().find(|e| e.call == call)?;
        entry.outcome = Some((digest, failed));
        let shown = entry.preview.clone();
        if config.failures_only && !failed {
            return None;
        }
        let (group, exact) = (entry.group, entry.exact);
        let members = session
            .entries
            .iter()
            .filter(|e| e.group == group && e.same_outcome(digest, failed));
        let count = members.clone().count();
        let all_exact_repeats = members.clone().all(|e| e.exact == exact);
        if count < config.min_count || all_exact_repeats {
            return None;
        }

        Some(Detection {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            key: group,
            message: format!(
                "`{}` was called {count} times with near-identical arguments and the same outcome \
                 in the last {} calls; changing the arguments slightly will not give a different \
                 result",
                ev.tool,
                session.entries.len()
            ),
            pattern: format!("{}({shown}) ≈ ×{count}", ev.tool),
        })
    }
}

impl Detector for Similarity {
    fn name() -> &'static str {
        "similarity"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> Value {
        serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "loopguard similarity plugin",
            "description": "One event costs at most 2^24 (16,777,216) character steps of string comparison, plus time linear in its arguments (at most 256 KiB are parsed as JSON); memory is at most max_sessions × window sketches of at most 4 × max_chars characters.",
            "type": ["object", "null"],
            "additionalProperties": false,
            "properties": {
                "threshold": {
                    "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.8,
                    "description": "similarity at which two calls' arguments count as the same"
                },
                "min_count": {
                    "type": "integer", "minimum": 2, "default": 3,
                    "description": "similar calls, this one included, that make a loop"
                },
                "window": {
                    "type": "integer", "minimum": 2, "maximum": MAX_WINDOW, "default": 10,
                    "description": "recent calls of the session that are compared (at most 100: one event compares at most window − 1 calls, within a budget of 2^24 character steps)"
                },
                "max_chars": {
                    "type": "integer", "minimum": 1, "maximum": MAX_CHARS, "default": 256,
                    "description": "characters kept per string argument (at most 1024; a call keeps at most 4 × max_chars characters; one event spends at most 2^24 character steps comparing them)"
                },
                "max_sessions": {
                    "type": "integer", "minimum": 1, "maximum": MAX_SESSIONS, "default": 1024,
                    "description": "sessions remembered at once (at most 65536)"
                },
                "failures_only": {
                    "type": "boolean", "default": true,
                    "description": "count only calls whose results failed"
                }
            }
        })
    }

    fn new(config: Value) -> Result<Self, String> {
        Ok(Similarity::with_config(Config::from_json(&config)?))
    }

    // Its state is per session: sessions are spread over instances with their own locks, so
    // one session's event never waits for another shard's.
    const SESSION_SHARDS: usize = 16;

    /// Each shard remembers its share of `max_sessions`.
    fn new_shard(config: Value, shards: usize) -> Result<Self, String> {
        let mut c = Config::from_json(&config)?;
        c.max_sessions = c.max_sessions.div_ceil(shards.max(1));
        Ok(Similarity::with_config(c))
    }

    fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
        match ev.kind {
            EventKind::Call => self.on_call(ev),
            EventKind::Result => self.on_result(ev),
            EventKind::Reset => {
                self.sessions.remove(ev.session);
                None
            }
            _ => None,
        }
    }
}

export_plugin!(Similarity);

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(tool: &'a str, args: &'a str, exact: u64) -> Event<'a> {
        let mut ev = Event::new(EventKind::Call, "s");
        ev.tool = tool;
        ev.arguments = args;
        ev.exact = exact;
        ev
    }

    /// The call `id`'s result: `digest` stands for its outcome.
    fn result<'a>(tool: &'a str, id: &'a str, digest: u64, failed: bool) -> Event<'a> {
        let mut ev = Event::new(EventKind::Result, "s");
        ev.tool = tool;
        ev.call_id = id;
        ev.result_digest = digest;
        ev.is_error = failed;
        ev
    }

    /// Calls with `queries`, each answered by `outcome(i)` = (digest, failed); the verdicts on
    /// the results.
    fn searches(
        d: &mut Similarity,
        queries: &[&str],
        outcome: impl Fn(usize) -> (u64, bool),
    ) -> Vec<Option<Detection>> {
        let ids: Vec<String> = (0..queries.len()).map(|i| format!("c{i}")).collect();
        queries
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let args = format!(r#"{{"query":"{q}"}}"#);
                let mut c = call("search", &args, i as u64 + 1);
                c.call_id = &ids[i];
                assert!(
                    d.on_event(&c).is_none(),
                    "calls are judged by their results"
                );
                let (digest, failed) = outcome(i);
                d.on_event(&result("search", &ids[i], digest, failed))
            })
            .collect()
    }

    fn detector() -> Similarity {
        Similarity::new(Value::Null).unwrap()
    }

    #[test]
    fn near_identical_strings_failing_alike_make_a_loop() {
        let mut d = detector();
        let hits = searches(&mut d, &["foo", "fo0", "f00", "foo "], |_| (42, true));
        assert!(hits[0].is_none() && hits[1].is_none());
        let last = hits[3].as_ref().expect("the fourth call is a loop");
        assert!(last.count >= 3, "{last:?}");
        assert!(last.message.contains("`search`"), "{}", last.message);
        let keys: Vec<u64> = hits.iter().flatten().map(|d| d.key).collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "one loop, one key");
    }

    /// Near-identical calls whose results are new (the next file, another error) are work.
    #[test]
    fn near_identical_strings_with_new_outcomes_are_not_a_loop() {
        let mut d = detector();
        let hits = searches(&mut d, &["foo", "fo0", "f00", "foo "], |i| (i as u64, true));
        assert!(hits.iter().all(Option::is_none), "{hits:?}");
        // Successes are not counted by default.
        let mut d = detector();
        let hits = searches(&mut d, &["foo", "fo0", "f00", "foo "], |_| (42, false));
        assert!(hits.iter().all(Option::is_none), "{hits:?}");
        // Unless asked to.
        let mut d = Similarity::new(serde_json::json!({"failures_only": false})).unwrap();
        let hits = searches(&mut d, &["foo", "fo0", "f00", "foo "], |_| (42, false));
        assert!(hits[3].is_some(), "{hits:?}");
    }

    #[test]
    fn exact_repeats_are_left_to_the_built_in_detectors() {
        let mut d = detector();
        for _ in 0..5 {
            assert!(
                d.on_event(&call("search", r#"{"query":"foo"}"#, 7))
                    .is_none()
            );
        }
    }

    #[test]
    fn paging_is_not_a_loop() {
        let mut d = detector();
        for page in 1..=6 {
            let args = format!(r#"{{"query":"foo","page":{page}}}"#);
            assert!(
                d.on_event(&call("search", &args, page)).is_none(),
                "page {page}"
            );
        }
    }

    #[test]
    fn different_tools_do_not_mix() {
        let mut d = detector();
        for (i, tool) in ["a", "b", "c", "d"].iter().enumerate() {
            assert!(
                d.on_event(&call(tool, r#"{"q":"foo"}"#, i as u64))
                    .is_none()
            );
        }
    }

    #[test]
    fn unrelated_arguments_are_not_similar() {
        let mut d = detector();
        for (i, q) in [
            "rust borrow checker",
            "weather in Paris",
            "sqlite wal mode",
            "tokio select",
        ]
        .iter()
        .enumerate()
        {
            let args = format!(r#"{{"query":"{q}"}}"#);
            assert!(
                d.on_event(&call("search", &args, i as u64)).is_none(),
                "{q}"
            );
        }
    }

    #[test]
    fn the_window_forgets_old_calls() {
        let mut d = Similarity::new(serde_json::json!({"window": 3, "min_count": 3})).unwrap();
        assert!(d.on_event(&call("s", r#"{"q":"foo"}"#, 1)).is_none());
        assert!(d.on_event(&call("s", r#"{"q":"fooo"}"#, 2)).is_none());
        for (i, tool) in ["t1", "t2", "t3"].into_iter().enumerate() {
            assert!(d.on_event(&call(tool, "{}", i as u64 + 3)).is_none());
        }
        assert!(d.on_event(&call("s", r#"{"q":"foo "}"#, 9)).is_none());
    }

    #[test]
    fn reset_forgets_the_session() {
        let mut d = detector();
        d.on_event(&call("s", r#"{"q":"foo"}"#, 1));
        d.on_event(&call("s", r#"{"q":"fo0"}"#, 2));
        d.on_event(&Event::new(EventKind::Reset, "s"));
        assert!(d.on_event(&call("s", r#"{"q":"foo "}"#, 3)).is_none());
    }

    #[test]
    fn sessions_are_bounded() {
        let mut d = Similarity::new(serde_json::json!({"max_sessions": 2})).unwrap();
        for s in ["a", "b", "c", "d"] {
            let mut ev = call("t", "{}", 1);
            ev.session = s;
            d.on_event(&ev);
        }
        assert_eq!(d.sessions.len(), 2);
        assert!(d.sessions.peek("d").is_some());
    }

    #[test]
    fn strings_are_capped() {
        let long = "x".repeat(10_000);
        let s = sketch_arguments(&format!(r#"{{"a":"{long}","b":"{long}"}}"#), 256);
        let Sketch::Obj(fields) = s else {
            panic!("an object")
        };
        let lens: Vec<usize> = fields
            .iter()
            .map(|(_, v)| match v {
                Sketch::Str { chars, .. } => *chars,
                _ => 0,
            })
            .collect();
        assert_eq!(lens, vec![256, 256]);
        let total = sketch_arguments(
            &serde_json::to_string(&vec![long.as_str(); 10]).unwrap(),
            256,
        );
        let Sketch::Arr(items) = total else {
            panic!("an array")
        };
        let kept: usize = items
            .iter()
            .map(|v| match v {
                Sketch::Str { chars, .. } => *chars,
                _ => 0,
            })
            .sum();
        assert_eq!(kept, 1024, "4 × max_chars per call");
    }

    #[test]
    fn object_similarity_is_the_share_of_similar_fields() {
        let a = sketch_arguments(r#"{"q":"foo","page":1}"#, 256);
        let b = sketch_arguments(r#"{"q":"foo","page":2}"#, 256);
        assert!((similarity(&a, &b, &mut Steps::new()) - 0.5).abs() < 1e-9);
        let c = sketch_arguments(r#"{"q":"foo","extra":true}"#, 256);
        let d = sketch_arguments(r#"{"q":"foo"}"#, 256);
        assert!((similarity(&c, &d, &mut Steps::new()) - 0.5).abs() < 1e-9);
        assert_eq!(similarity(&a, &a, &mut Steps::new()), 1.0);
    }

    #[test]
    fn raw_text_arguments_are_compared_as_text() {
        let a = sketch_arguments("ls -la /tmp", 256);
        let b = sketch_arguments("ls -la /tmp ", 256);
        assert_eq!(similarity(&a, &b, &mut Steps::new()), 1.0);
    }

    #[test]
    fn config_is_checked() {
        assert!(Similarity::new(serde_json::json!({"min_count": 20, "window": 5})).is_err());
        assert!(Similarity::new(serde_json::json!({"threshold": 0})).is_err());
        let c = Config::from_json(&serde_json::json!({"threshold": 0.9, "window": 20})).unwrap();
        assert_eq!((c.threshold, c.window, c.min_count), (0.9, 20, 3));
    }

    /// Unlike text of `n` characters (a fixed-seed generator): no pair is equal, so every pair
    /// of strings is compared in full.
    fn unlike_text(seed: u64, n: usize) -> String {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(b'a' + (state % 26) as u8)
            })
            .collect()
    }

    #[test]
    fn the_largest_accepted_settings_spend_at_most_the_step_budget_per_event() {
        let max = serde_json::json!({
            "window": MAX_WINDOW, "max_chars": MAX_CHARS, "max_sessions": MAX_SESSIONS,
            "min_count": 2, "threshold": 0.01, "failures_only": false
        });
        let mut d = Similarity::new(max).unwrap();
        // Every call: four strings of `max_chars` unlike characters, so each pair is compared.
        let args = |i: u64| {
            serde_json::json!({
                "a": unlike_text(i * 4, MAX_CHARS),
                "b": unlike_text(i * 4 + 1, MAX_CHARS),
                "c": unlike_text(i * 4 + 2, MAX_CHARS),
                "d": unlike_text(i * 4 + 3, MAX_CHARS),
            })
            .to_string()
        };
        // The window fills with calls sharing one exact fingerprint (they match each other
        // without comparing), then one call with another fingerprint compares them all.
        for i in 0..MAX_WINDOW as u64 {
            d.on_event(&call("t", &args(i), 7));
        }
        d.on_event(&call("t", &args(1000), 8));
        let most = d.last_steps;
        assert!(most <= MAX_STEPS_PER_EVENT, "{most}");
        // Unbounded, the last call would cost (window − 1) × 4 pairs × 2 × max_chars² steps.
        let unbounded = (MAX_WINDOW as u64 - 1) * 4 * 2 * (MAX_CHARS as u64).pow(2);
        assert!(unbounded > MAX_STEPS_PER_EVENT);
        assert!(
            most + 2 * (MAX_CHARS as u64).pow(2) > MAX_STEPS_PER_EVENT,
            "the budget was reached, not skipped: {most}"
        );
    }

    #[test]
    fn the_defaults_fit_the_budget_in_the_worst_case() {
        let c = Config::default();
        let worst = (c.window as u64 - 1) * 8 * (c.max_chars as u64).pow(2);
        assert!(worst <= MAX_STEPS_PER_EVENT, "{worst}");
    }

    #[test]
    fn settings_over_the_caps_are_refused_and_the_schema_states_them() {
        for (key, max) in [
            ("window", MAX_WINDOW),
            ("max_chars", MAX_CHARS),
            ("max_sessions", MAX_SESSIONS),
        ] {
            let err = Similarity::new(serde_json::json!({ key: max + 1 })).unwrap_err();
            assert!(err.contains(key) && err.contains(&max.to_string()), "{err}");
            let schema = Similarity::config_schema();
            assert_eq!(schema["properties"][key]["maximum"], max, "{key}");
        }
        assert!(
            Similarity::config_schema()["description"]
                .as_str()
                .unwrap()
                .contains("2^24")
        );
    }

    #[test]
    fn huge_arguments_are_sketched_as_text_without_parsing() {
        let huge = format!(r#"{{"a":"{}"}}"#, "x".repeat(MAX_PARSED_BYTES));
        let Sketch::Str { chars, .. } = sketch_arguments(&huge, 256) else {
            panic!("sketched as text")
        };
        assert_eq!(chars, 256);
    }
}
