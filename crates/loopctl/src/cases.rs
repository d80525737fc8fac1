//! `loopctl test`: labelled transcripts as regression tests of a policy.
//!
//! A case is a transcript (any format `simulate` reads) plus an `expect` block that says whether
//! it is a loop and where the policy must first intervene:
//! `{"loop": true, "unit": "call", "earliest": 3, "latest": 4}`. The block sits either beside
//! `messages` in the case file itself (with `id`, `source`, `description`, `tags`; the file's
//! other keys are ignored, as in a request body), or in a sidecar `NAME.expect.json` next to
//! `NAME.json` / `NAME.jsonl` (the only way for an event-JSONL transcript), holding `expect`,
//! `tags`, `description`, `id` and `source` and nothing else. A file with both, or with neither,
//! is bad input.
//!
//! Every case is replayed by the same replay as `loopctl simulate` (`loopguard_transcript::replay`), through a fresh
//! engine built the same way (policy, `LOOPGUARD_*` tier, overrides, plugins). The first
//! intervention (any action but `allow`) decides: inside `[earliest, latest]` a loop case passes,
//! before it is `early`, after it or never is `late` / `missed`; a non-loop case passes when
//! nothing intervenes, and is a false alarm otherwise, a hard one when any intervention blocks
//! or terminates.

use std::path::{Path, PathBuf};

use loopguard_engine::Action;
use serde_json::{Map, Value, json};

use crate::simulate::{self, InputError, Setup};
use crate::transcript::replay::{self, Intervention, Step, Worker};
use crate::{EXIT_INTERVENED, EXIT_INVALID, EXIT_OK, emit};

/// What `test` was asked to do.
#[derive(Debug)]
pub struct Options {
    pub rules: Option<PathBuf>,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub json: bool,
    /// Gate: the least fraction of loop cases caught in range.
    pub min_recall: Option<f64>,
    /// Gate: the most non-loop cases with an intervention.
    pub max_false_alarms: Option<usize>,
    /// Gate: the most non-loop cases with a block or terminate (0 when another gate is given).
    pub max_hard_false_alarms: Option<usize>,
    /// Cases carrying any of these tags are left out.
    pub exclude_tags: Vec<String>,
}

/// The name ending of a sidecar expect file.
const SIDECAR: &str = ".expect.json";
/// The keys a sidecar may hold.
const SIDECAR_KEYS: &[&str] = &["expect", "tags", "description", "id", "source"];

/// Parses `--min-recall`: a fraction (`0.9`) or a percentage (`90%`).
pub fn parse_recall(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (number, percent) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a fraction (0.9) or a percentage (90%)"))?;
    let fraction = if percent { value / 100.0 } else { value };
    if !(0.0..=1.0).contains(&fraction) {
        return Err(if percent || value < 0.0 {
            format!("`{text}` is outside 0%–100%")
        } else {
            format!(
                "`{text}` is not a fraction between 0 and 1; write `{}%` for a percentage",
                value
            )
        });
    }
    Ok(fraction)
}

// --- the case format ------------------------------------------------------------------------

/// What positions count: tool calls or assistant messages, both from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Call,
    AssistantTurn,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Call => "call",
            Unit::AssistantTurn => "assistant_turn",
        }
    }

    fn word(self) -> &'static str {
        match self {
            Unit::Call => "call",
            Unit::AssistantTurn => "turn",
        }
    }

    /// Where an intervention lands in this unit (0: before the first call).
    fn position(self, i: &Intervention) -> u64 {
        match self {
            Unit::Call => i.call.map_or(0, |c| c as u64),
            Unit::AssistantTurn => i.turn,
        }
    }
}

#[derive(Debug)]
struct Expect {
    is_loop: bool,
    unit: Unit,
    /// Set for a loop case.
    earliest: Option<u64>,
    /// `None`: no upper bound.
    latest: Option<u64>,
}

impl Expect {
    fn parse(v: &Value) -> Result<Expect, String> {
        let Value::Object(e) = v else {
            return Err("`expect` must be an object".into());
        };
        let is_loop = match e.get("loop") {
            Some(Value::Bool(b)) => *b,
            None | Some(Value::Null) => {
                return Err("`expect.loop` is missing: true for a loop, false for none".into());
            }
            Some(_) => return Err("`expect.loop` must be true or false".into()),
        };
        let unit = match e.get("unit") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "call" => Some(Unit::Call),
            Some(Value::String(s)) if s == "assistant_turn" => Some(Unit::AssistantTurn),
            Some(_) => return Err("`expect.unit` must be `call` or `assistant_turn`".into()),
        };
        let position = |key: &str| match e.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n >= 1)
                .map(Some)
                .ok_or_else(|| format!("`expect.{key}` must be a positive integer or null")),
        };
        let earliest = position("earliest")?;
        let latest = position("latest")?;
        if !is_loop {
            if earliest.is_some() || latest.is_some() {
                return Err(
                    "a case with `loop: false` takes no position: `expect.earliest` and `expect.latest` must be null"
                        .into(),
                );
            }
            return Ok(Expect {
                is_loop,
                unit: unit.unwrap_or(Unit::Call),
                earliest,
                latest,
            });
        }
        let unit =
            unit.ok_or_else(|| "`expect.unit` is missing: `call` or `assistant_turn`".to_owned())?;
        let first = earliest.ok_or_else(|| {
            "`expect.earliest` is missing: the first position where the loop may be caught"
                .to_owned()
        })?;
        if let Some(last) = latest
            && last < first
        {
            return Err(format!(
                "`expect.latest` ({last}) is before `expect.earliest` ({first})"
            ));
        }
        Ok(Expect {
            is_loop,
            unit,
            earliest,
            latest,
        })
    }

    /// `call 3–4`, `turn ≥ 3`, `no loop`.
    fn range(&self) -> String {
        if !self.is_loop {
            return "no loop".into();
        }
        let word = self.unit.word();
        match (self.earliest.unwrap_or(1), self.latest) {
            (a, Some(b)) if a == b => format!("{word} {a}"),
            (a, Some(b)) => format!("{word} {a}–{b}"),
            (a, None) => format!("{word} ≥ {a}"),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "loop": self.is_loop,
            "unit": self.unit.as_str(),
            "earliest": self.earliest,
            "latest": self.latest,
        })
    }
}

/// What a case file (or its sidecar) says beside the transcript.
#[derive(Debug)]
struct Meta {
    id: Option<String>,
    tags: Vec<String>,
    expect: Expect,
}

impl Meta {
    /// Reads the case keys of `obj`; in a sidecar, every other key is an error.
    fn parse(obj: &Map<String, Value>, sidecar: bool) -> Result<Meta, String> {
        if sidecar && let Some(k) = obj.keys().find(|k| !SIDECAR_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key `{k}` in a sidecar expect file; allowed: {}",
                SIDECAR_KEYS.join(", ")
            ));
        }
        let string = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{key}` must be a string")),
        };
        let id = string("id")?;
        string("description")?;
        string("source")?;
        let tags = match obj.get("tags") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or("`tags` must be an array of strings")?,
            Some(_) => return Err("`tags` must be an array of strings".into()),
        };
        let expect = Expect::parse(obj.get("expect").unwrap_or(&Value::Null))?;
        Ok(Meta { id, tags, expect })
    }
}

/// `dir/NAME.expect.json` for `dir/NAME.json` or `dir/NAME.jsonl`.
fn sidecar_of(file: &Path) -> PathBuf {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.with_file_name(format!("{stem}{SIDECAR}"))
}

fn is_sidecar(file: &Path) -> bool {
    file.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(SIDECAR))
}

/// The transcript a sidecar belongs to: `NAME.json`, else `NAME.jsonl`, if either exists.
fn transcript_of(sidecar: &Path) -> Option<PathBuf> {
    let name = sidecar.file_name()?.to_string_lossy().into_owned();
    let stem = name.strip_suffix(SIDECAR)?;
    ["json", "jsonl"]
        .iter()
        .map(|ext| sidecar.with_file_name(format!("{stem}.{ext}")))
        .find(|p| p.is_file())
}

fn orphan(sidecar: &Path) -> InputError {
    InputError {
        code: EXIT_INVALID,
        message: format!(
            "{}: a sidecar expect file without its transcript (the same name ending in `.json` or `.jsonl`)",
            sidecar.display()
        ),
    }
}

/// A case file to run, or a path that yields none.
enum Entry {
    Case(PathBuf),
    Bad(PathBuf, InputError),
}

/// The case files named by `paths`, in order: files as given (a sidecar stands for its
/// transcript), directories as their `*.json` / `*.jsonl` files, sorted, not recursing.
fn collect(paths: &[PathBuf]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let cannot_run = |path: &Path, e: std::io::Error| InputError {
        code: crate::EXIT_CANNOT_RUN,
        message: format!("{}: {e}", path.display()),
    };
    for path in paths {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => {
                entries.push(Entry::Bad(path.clone(), cannot_run(path, e)));
                continue;
            }
        };
        if !meta.is_dir() {
            entries.push(if is_sidecar(path) {
                match transcript_of(path) {
                    Some(t) => Entry::Case(t),
                    None => Entry::Bad(path.clone(), orphan(path)),
                }
            } else {
                Entry::Case(path.clone())
            });
            continue;
        }
        let listing = match std::fs::read_dir(path) {
            Ok(l) => l,
            Err(e) => {
                entries.push(Entry::Bad(path.clone(), cannot_run(path, e)));
                continue;
            }
        };
        let mut found = Vec::new();
        for entry in listing {
            let file = match entry {
                Ok(e) => e.path(),
                Err(e) => {
                    entries.push(Entry::Bad(path.clone(), cannot_run(path, e)));
                    continue;
                }
            };
            let json = file
                .extension()
                .is_some_and(|e| e == "json" || e == "jsonl");
            if json && !file.is_dir() {
                found.push(file);
            }
        }
        found.sort();
        for file in found {
            if !is_sidecar(&file) {
                entries.push(Entry::Case(file));
            } else if transcript_of(&file).is_none() {
                let e = orphan(&file);
                entries.push(Entry::Bad(file, e));
            }
        }
    }
    // A case named twice (a file and its sidecar, a glob and its directory) runs once.
    let mut seen = std::collections::HashSet::new();
    entries.retain(|e| match e {
        Entry::Case(p) => seen.insert(p.clone()),
        Entry::Bad(..) => true,
    });
    entries
}

/// A case, read and checked.
struct Case {
    meta: Meta,
    transcript: crate::transcript::Transcript,
}

/// Reads a case file, its transcript and its expect block (embedded or in a sidecar).
fn load(file: &Path) -> Result<Case, InputError> {
    let text = simulate::read_text(file)?;
    let transcript = simulate::parse_transcript(file, &text)?;
    let invalid = |at: &Path, message: String| InputError {
        code: EXIT_INVALID,
        message: format!("{}: {message}", at.display()),
    };
    // An embedded expect block: the file is one JSON object with an `expect` key.
    let body = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let embedded = match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(obj)) if obj.contains_key("expect") => Some(obj),
        _ => None,
    };
    let sidecar = sidecar_of(file);
    let has_sidecar = match sidecar.try_exists() {
        Ok(b) => b,
        Err(e) => {
            return Err(InputError {
                code: crate::EXIT_CANNOT_RUN,
                message: format!("{}: {e}", sidecar.display()),
            });
        }
    };
    let meta = match (embedded, has_sidecar) {
        (Some(_), true) => {
            return Err(invalid(
                file,
                format!(
                    "the case has an `expect` block and a sidecar {}; keep one",
                    sidecar.display()
                ),
            ));
        }
        (Some(obj), false) => Meta::parse(&obj, false).map_err(|m| invalid(file, m))?,
        (None, true) => {
            let text = simulate::read_text(&sidecar)?;
            let value: Value = serde_json::from_str(&text).map_err(|e| InputError {
                code: EXIT_INVALID,
                message: format!(
                    "{}:{}:{}: invalid JSON: {e}",
                    sidecar.display(),
                    e.line(),
                    e.column()
                ),
            })?;
            let Value::Object(obj) = value else {
                return Err(invalid(&sidecar, "a sidecar must be a JSON object".into()));
            };
            Meta::parse(&obj, true).map_err(|m| invalid(&sidecar, m))?
        }
        (None, false) => {
            return Err(invalid(
                file,
                format!(
                    "no `expect` block: add one beside `messages`, or write a sidecar {}",
                    sidecar.display()
                ),
            ));
        }
    };
    Ok(Case { meta, transcript })
}

// --- judging --------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Early,
    Late,
    Missed,
    FalseAlarm,
    HardFalseAlarm,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Early => "EARLY",
            Outcome::Late => "LATE",
            Outcome::Missed => "MISSED",
            Outcome::FalseAlarm => "FALSE ALARM",
            Outcome::HardFalseAlarm => "HARD FALSE ALARM",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Early => "early",
            Outcome::Late => "late",
            Outcome::Missed => "missed",
            Outcome::FalseAlarm => "false_alarm",
            Outcome::HardFalseAlarm => "hard_false_alarm",
        }
    }
}

/// The outcome of a case, its first intervention, and (on a non-loop case) the first one that
/// blocks or terminates.
fn judge<'i>(
    expect: &Expect,
    interventions: &'i [Intervention],
) -> (Outcome, Option<&'i Intervention>, Option<&'i Intervention>) {
    let first = interventions.first();
    if !expect.is_loop {
        let hard = interventions.iter().find(|i| i.action >= Action::Block);
        let outcome = match (first, hard) {
            (None, _) => Outcome::Pass,
            (Some(_), None) => Outcome::FalseAlarm,
            (Some(_), Some(_)) => Outcome::HardFalseAlarm,
        };
        return (outcome, first, hard);
    }
    let outcome = match first.map(|i| expect.unit.position(i)) {
        None => Outcome::Missed,
        Some(at) if at < expect.earliest.unwrap_or(1) => Outcome::Early,
        Some(at) if expect.latest.is_some_and(|last| at > last) => Outcome::Late,
        Some(_) => Outcome::Pass,
    };
    (outcome, first, None)
}

/// `call 3 warn cycle (categories.exploration/ladders.default[0])`.
fn describe(unit: Unit, i: &Intervention) -> String {
    let at = match unit.position(i) {
        0 => "before any call".to_owned(),
        n => format!("{} {n}", unit.word()),
    };
    format!(
        "{at} {} {}{}",
        i.action.as_str(),
        i.detector.as_deref().unwrap_or("?"),
        i.rule
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    )
}

#[derive(Debug, Default)]
struct Totals {
    cases: usize,
    passed: usize,
    excluded: usize,
    errors: usize,
    loops: usize,
    caught: usize,
    early: usize,
    late: usize,
    missed: usize,
    non_loops: usize,
    /// Non-loop cases with an intervention, hard ones included.
    false_alarms: usize,
    hard_false_alarms: usize,
}

impl Totals {
    fn add(&mut self, is_loop: bool, outcome: Outcome) {
        self.cases += 1;
        if is_loop {
            self.loops += 1;
        } else {
            self.non_loops += 1;
        }
        match outcome {
            Outcome::Pass if is_loop => self.caught += 1,
            Outcome::Pass => {}
            Outcome::Early => self.early += 1,
            Outcome::Late => self.late += 1,
            Outcome::Missed => self.missed += 1,
            Outcome::FalseAlarm => self.false_alarms += 1,
            Outcome::HardFalseAlarm => {
                self.false_alarms += 1;
                self.hard_false_alarms += 1;
            }
        }
        if outcome == Outcome::Pass {
            self.passed += 1;
        }
    }

    /// Loop cases caught in range, as a fraction; `None` without loop cases.
    fn recall(&self) -> Option<f64> {
        (self.loops > 0).then(|| self.caught as f64 / self.loops as f64)
    }
}

/// One gate and whether the run meets it.
struct Gate {
    flag: &'static str,
    key: &'static str,
    limit: Value,
    value: Value,
    shown: String,
    met: bool,
}

fn gates(opts: &Options, t: &Totals) -> Vec<Gate> {
    let mut gates = Vec::new();
    if let Some(min) = opts.min_recall {
        let recall = t.recall();
        gates.push(Gate {
            flag: "--min-recall",
            key: "min_recall",
            limit: json!(min),
            value: json!(recall),
            shown: format!(
                "{} (limit {})",
                recall.map_or("n/a (no loop cases)".into(), percent),
                percent(min)
            ),
            // Compared on counts, so that 9 of 10 meets 0.9 exactly.
            met: t.caught as f64 >= min * t.loops as f64 - 1e-9,
        });
    }
    if let Some(max) = opts.max_false_alarms {
        gates.push(Gate {
            flag: "--max-false-alarms",
            key: "max_false_alarms",
            limit: json!(max),
            value: json!(t.false_alarms),
            shown: format!("{} (limit {max})", t.false_alarms),
            met: t.false_alarms <= max,
        });
    }
    let gating = opts.min_recall.is_some()
        || opts.max_false_alarms.is_some()
        || opts.max_hard_false_alarms.is_some();
    if gating {
        let max = opts.max_hard_false_alarms.unwrap_or(0);
        gates.push(Gate {
            flag: "--max-hard-false-alarms",
            key: "max_hard_false_alarms",
            limit: json!(max),
            value: json!(t.hard_false_alarms),
            shown: format!("{} (limit {max})", t.hard_false_alarms),
            met: t.hard_false_alarms <= max,
        });
    }
    gates
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

// --- the command ----------------------------------------------------------------------------

pub fn run(paths: &[PathBuf], opts: &Options) -> u8 {
    let mut setup = match Setup::load(
        opts.rules.as_deref(),
        opts.backend.as_deref(),
        opts.model.as_deref(),
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let entries = collect(paths);
    let mut totals = Totals::default();
    let mut worst_input = EXIT_OK;
    let mut report_error = |file: &Path, e: &InputError, totals: &mut Totals| {
        totals.errors += 1;
        worst_input = worst_input.max(e.code);
        eprintln!("error: {}", e.message);
        if opts.json {
            emit(&format!(
                "{}\n",
                json!({
                    "file": file.display().to_string(),
                    "outcome": "error",
                    "error": e.message,
                    "exit": e.code,
                })
            ));
        }
    };
    if entries.is_empty() {
        eprintln!("error: no test cases: no `.json` or `.jsonl` file in the paths given");
        return EXIT_INVALID;
    }
    for entry in &entries {
        let file = match entry {
            Entry::Case(file) => file,
            Entry::Bad(path, e) => {
                report_error(path, e, &mut totals);
                continue;
            }
        };
        let case = match load(file) {
            Ok(c) => c,
            Err(e) => {
                report_error(file, &e, &mut totals);
                continue;
            }
        };
        if case.meta.tags.iter().any(|t| opts.exclude_tags.contains(t)) {
            totals.excluded += 1;
            continue;
        }
        let engine = match setup.engine() {
            Ok(e) => e,
            Err(code) => return code,
        };
        let workers = [Worker {
            file,
            name: String::new(),
            items: &case.transcript.items,
        }];
        let interventions = replay::replay(&workers, None, &engine, &mut |step| {
            if let Step::Note {
                item, event, note, ..
            } = step
            {
                eprintln!(
                    "warning: {}: event {event}, line {}: {}: {}",
                    file.display(),
                    item.line,
                    note.code,
                    note.message
                );
            }
        });
        let expect = &case.meta.expect;
        let (outcome, first, hard) = judge(expect, &interventions);
        totals.add(expect.is_loop, outcome);
        if opts.json {
            let record = |i: &Intervention| {
                let mut r = i.record(file);
                if let Value::Object(fields) = &mut r {
                    fields.remove("file");
                }
                r
            };
            emit(&format!(
                "{}\n",
                json!({
                    "file": file.display().to_string(),
                    "id": case.meta.id,
                    "tags": case.meta.tags,
                    "outcome": outcome.key(),
                    "expect": expect.to_json(),
                    "at": first.map(|i| expect.unit.position(i)),
                    "first": first.map(record),
                    "hard": hard.map(record),
                    "interventions": interventions.len(),
                })
            ));
        } else {
            let got = match first {
                None => "got nothing".to_owned(),
                Some(i) => format!("got {}", describe(expect.unit, i)),
            };
            let then = match hard {
                Some(h) if !first.is_some_and(|f| std::ptr::eq(f, h)) => {
                    format!("; then {}", describe(expect.unit, h))
                }
                _ => String::new(),
            };
            emit(&format!(
                "{:<16}  {}  expected {}, {got}{then}\n",
                outcome.label(),
                file.display(),
                expect.range(),
            ));
        }
    }
    let gates = gates(opts, &totals);
    let failed = totals.cases - totals.passed;
    let code = if worst_input != EXIT_OK {
        worst_input
    } else if !gates.is_empty() {
        if gates.iter().all(|g| g.met) {
            EXIT_OK
        } else {
            EXIT_INTERVENED
        }
    } else if failed == 0 {
        EXIT_OK
    } else {
        EXIT_INTERVENED
    };
    let t = &totals;
    if opts.json {
        emit(&format!(
            "{}\n",
            json!({
                "totals": {
                    "cases": t.cases,
                    "passed": t.passed,
                    "failed": failed,
                    "excluded": t.excluded,
                    "errors": t.errors,
                    "loops": t.loops,
                    "caught": t.caught,
                    "recall": t.recall(),
                    "early": t.early,
                    "late": t.late,
                    "missed": t.missed,
                    "non_loops": t.non_loops,
                    "false_alarms": t.false_alarms,
                    "hard_false_alarms": t.hard_false_alarms,
                },
                "gates": gates.iter().map(|g| json!({
                    "gate": g.key,
                    "limit": g.limit,
                    "value": g.value,
                    "met": g.met,
                })).collect::<Vec<_>>(),
                "exit": code,
            })
        ));
        return code;
    }
    let mut summary = format!(
        "\n{}: {} passed, {} failed",
        plural(t.cases, "case", "cases"),
        t.passed,
        failed
    );
    if t.excluded > 0 {
        summary.push_str(&format!(
            "; {} left out by --exclude-tag {}",
            t.excluded,
            opts.exclude_tags.join(", ")
        ));
    }
    if t.errors > 0 {
        summary.push_str(&format!(
            "; {} bad input or unreadable (errors above)",
            plural(t.errors, "file is", "files are")
        ));
    }
    summary.push('\n');
    summary.push_str(&format!(
        "loops caught: {}/{} ({} recall); early {}, late {}, missed {}\n",
        t.caught,
        t.loops,
        t.recall().map_or("n/a".into(), percent),
        t.early,
        t.late,
        t.missed
    ));
    summary.push_str(&format!(
        "false alarms: {}/{} non-loops, {} hard (block or terminate)\n",
        t.false_alarms, t.non_loops, t.hard_false_alarms
    ));
    for g in &gates {
        summary.push_str(&format!(
            "{:<6} {} {}\n",
            if g.met { "ok" } else { "FAILED" },
            g.flag,
            g.shown
        ));
    }
    emit(&summary);
    code
}

/// The JSON Schema of a test case file, and of a sidecar expect file.
pub fn case_schema() -> Value {
    let text = |d: &str| json!({"type": ["string", "null"], "description": d});
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://loopguard.invalid/schema/test-case.json",
        "title": "loopguard test case",
        "description": "A case of `loopctl test`: a transcript with `messages` (OpenAI chat-completions or Anthropic messages) and an `expect` block; or a sidecar NAME.expect.json next to the transcript NAME.json / NAME.jsonl, holding the expect block alone.",
        "definitions": {
            "expect": {
                "description": "Whether the transcript is a loop and where the policy must first intervene (any action but allow).",
                "type": "object",
                "properties": {
                    "loop": {"type": "boolean", "description": "A loop the policy must catch (true), or work it must leave alone (false)."},
                    "unit": {"enum": ["call", "assistant_turn"], "description": "What positions count from 1: tool calls across the transcript, or assistant messages."},
                    "earliest": {"type": ["integer", "null"], "minimum": 1, "description": "The first position where intervening is right; earlier is a false alarm before the loop existed."},
                    "latest": {"type": ["integer", "null"], "minimum": 1, "description": "The last position where intervening is in time; null: no upper bound."},
                    "kinds": {"type": "array", "items": {"type": "string"}, "description": "Informative (the kind of loop); not checked."}
                },
                "required": ["loop"],
                "if": {"properties": {"loop": {"const": true}}},
                "then": {"required": ["unit", "earliest"], "properties": {"earliest": {"type": "integer"}}},
                "else": {"properties": {"earliest": {"type": "null"}, "latest": {"type": "null"}}}
            },
            "tags": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "Labels; `loopctl test --exclude-tag TAG` leaves out the cases carrying TAG."
            }
        },
        "oneOf": [
            {
                "title": "case",
                "type": "object",
                "properties": {
                    "messages": {"type": "array", "items": {"type": "object", "required": ["role"]}, "description": "The conversation, as `loopctl simulate` reads it."},
                    "expect": {"$ref": "#/definitions/expect"},
                    "id": text("A short name of the case."),
                    "source": text("Where the case comes from."),
                    "description": text("What happens and why it is labelled so."),
                    "tags": {"$ref": "#/definitions/tags"}
                },
                "required": ["messages", "expect"],
                "additionalProperties": true
            },
            {
                "title": "sidecar",
                "type": "object",
                "properties": {
                    "expect": {"$ref": "#/definitions/expect"},
                    "id": text("A short name of the case."),
                    "source": text("Where the case comes from."),
                    "description": text("What happens and why it is labelled so."),
                    "tags": {"$ref": "#/definitions/tags"}
                },
                "required": ["expect"],
                "additionalProperties": false
            }
        ]
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn recall_takes_a_fraction_or_a_percentage() {
        assert_eq!(parse_recall("0.9"), Ok(0.9));
        assert_eq!(parse_recall("90%"), Ok(0.9));
        assert_eq!(parse_recall(" 100 % "), Ok(1.0));
        assert_eq!(parse_recall("0"), Ok(0.0));
        assert!(parse_recall("90").unwrap_err().contains("90%"));
        assert!(parse_recall("120%").is_err());
        assert!(parse_recall("-0.1").is_err());
        assert!(parse_recall("most").is_err());
        assert!(parse_recall("NaN").is_err());
    }

    #[test]
    fn expect_blocks_are_checked() {
        let ok = |v: Value| Expect::parse(&v).unwrap();
        let err = |v: Value| Expect::parse(&v).unwrap_err();
        let e = ok(
            json!({"loop": true, "unit": "call", "earliest": 3, "latest": null, "kinds": ["x"]}),
        );
        assert_eq!((e.earliest, e.latest), (Some(3), None));
        assert_eq!(e.range(), "call ≥ 3");
        assert_eq!(
            ok(json!({"loop": true, "unit": "assistant_turn", "earliest": 2, "latest": 2})).range(),
            "turn 2"
        );
        assert_eq!(ok(json!({"loop": false})).range(), "no loop");
        assert!(err(json!({"unit": "call"})).contains("`expect.loop` is missing"));
        assert!(err(json!({"loop": "yes"})).contains("true or false"));
        assert!(err(json!({"loop": true, "earliest": 3})).contains("`expect.unit`"));
        assert!(
            err(json!({"loop": true, "unit": "step", "earliest": 3})).contains("`expect.unit`")
        );
        assert!(
            err(json!({"loop": true, "unit": "call"})).contains("`expect.earliest` is missing")
        );
        assert!(err(json!({"loop": true, "unit": "call", "earliest": 0})).contains("positive"));
        assert!(
            err(json!({"loop": true, "unit": "call", "earliest": 4, "latest": 3}))
                .contains("before")
        );
        assert!(err(json!({"loop": false, "earliest": 3})).contains("loop: false"));
        assert!(err(json!([1])).contains("object"));
    }
}
