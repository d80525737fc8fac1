//! `loopctl simulate`: replay recorded conversations through a policy and show where and why it
//! would have intervened.
//!
//! Each transcript gets a fresh engine, so files never influence each other. The replay behaves
//! like a host that follows every verdict: the result of a blocked call is not replayed (the host
//! never ran the call), and a terminated session's later events are not replayed either.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use loopguard_engine::{
    Action, Arguments, Call, Engine, Event, Text, ToolResult, UserMessage, Verdict,
};
use loopguard_rules::{Config, Policy};
use serde_json::{Value, json};

use crate::transcript::{self, Args, Item, Kind, shorten};
use crate::{EXIT_CANNOT_RUN, EXIT_INTERVENED, EXIT_INVALID, EXIT_OK, emit};

/// What `simulate` was asked to do.
#[derive(Debug)]
pub struct Options {
    pub rules: Option<PathBuf>,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub json: bool,
    pub quiet: bool,
}

/// Loads the policy: the named file, else the built-in default. Prints diagnostics on failure.
fn load_policy(rules: Option<&Path>) -> Result<Policy, u8> {
    let loaded = match rules {
        Some(path) => match Policy::load(path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: {e}");
                return Err(EXIT_CANNOT_RUN);
            }
        },
        None => Policy::builtin_default(),
    };
    for d in loaded.diagnostics.iter().filter(|d| d.is_error()) {
        eprintln!("{}", loaded.sources.render(d));
    }
    loaded.policy.ok_or_else(|| {
        eprintln!(
            "error: the policy {} is invalid; run `loopctl validate` on it",
            rules.map_or("rules/default.yaml".into(), |p| p.display().to_string())
        );
        EXIT_INVALID
    })
}

pub fn run(files: &[PathBuf], opts: &Options) -> u8 {
    let policy = match load_policy(opts.rules.as_deref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let config = policy.resolve(opts.backend.as_deref(), opts.model.as_deref());
    let mut worst_input = EXIT_OK;
    let mut interventions = 0usize;
    for file in files {
        let text = match std::fs::read(file) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!(
                        "error: {}: not UTF-8 text (invalid byte at offset {})",
                        file.display(),
                        e.utf8_error().valid_up_to()
                    );
                    worst_input = worst_input.max(EXIT_INVALID);
                    continue;
                }
            },
            Err(e) => {
                eprintln!("error: {}: {e}", file.display());
                worst_input = EXIT_CANNOT_RUN;
                continue;
            }
        };
        let parsed = match transcript::parse(&text) {
            Ok(t) => t,
            Err(e) => {
                let col = e.column.map(|c| format!(":{c}")).unwrap_or_default();
                eprintln!("error: {}:{}{col}: {}", file.display(), e.line, e.message);
                worst_input = worst_input.max(EXIT_INVALID);
                continue;
            }
        };
        if !opts.json {
            let calls = parsed
                .items
                .iter()
                .filter(|i| matches!(i.kind, Kind::Call { .. }))
                .count();
            emit(&format!(
                "{}  ({}, {} events, {} tool calls, policy `{}`)\n",
                file.display(),
                parsed.format,
                parsed.items.len(),
                calls,
                policy.name
            ));
        }
        interventions += replay(file, &parsed.items, config.clone(), opts);
    }
    if !opts.json {
        emit(&format!(
            "{interventions} intervention{} in {} transcript{}\n",
            if interventions == 1 { "" } else { "s" },
            files.len(),
            if files.len() == 1 { "" } else { "s" },
        ));
    }
    if worst_input != EXIT_OK {
        worst_input
    } else if interventions > 0 {
        EXIT_INTERVENED
    } else {
        EXIT_OK
    }
}

/// Per-session bookkeeping of the replay.
#[derive(Default)]
struct SessionState {
    /// Transcript-wide call index of each call the engine has seen in this session since it
    /// started or was reset, by the engine's 1-based sequence number.
    calls: Vec<usize>,
    blocked: HashSet<String>,
    terminated: bool,
    skipped: usize,
}

/// Replays one transcript; returns how many interventions it produced.
fn replay(file: &Path, items: &[Item], config: Config, opts: &Options) -> usize {
    let engine = Engine::new(config);
    let mut sessions: HashMap<&str, SessionState> = HashMap::new();
    let mut tools_by_id: HashMap<(&str, &str), &str> = HashMap::new();
    let mut call_index = 0usize;
    let mut interventions = 0usize;
    for (k, item) in items.iter().enumerate() {
        let event_no = k + 1;
        let state = sessions.entry(item.session.as_str()).or_default();
        if state.terminated {
            state.skipped += 1;
            continue;
        }
        let session = item.session.as_str();
        let time_ms = item.time_ms;
        let (verdict, tool): (Verdict, Option<&str>) = match &item.kind {
            Kind::Call {
                id,
                tool,
                arguments,
            } => {
                call_index += 1;
                state.calls.push(call_index);
                tools_by_id.insert((session, id.as_str()), tool.as_str());
                let arguments = match arguments {
                    Args::Json(v) => Arguments::Json(v),
                    Args::Raw(s) => Arguments::Raw(s),
                };
                let v = engine.observe(&Event::Call(Call {
                    session,
                    call_id: id,
                    tool,
                    arguments,
                    time_ms,
                }));
                if !opts.json && !opts.quiet {
                    emit(&format!(
                        "  call {call_index:>3}  turn {:>3}  line {:>4}  {tool} {}\n",
                        item.turn,
                        item.line,
                        arguments_summary(item)
                    ));
                }
                if v.action >= Action::Block {
                    state.blocked.insert(id.clone());
                }
                (v, Some(tool.as_str()))
            }
            Kind::Result {
                id,
                output,
                error,
                exit_code,
            } => {
                if state.blocked.contains(id) {
                    if !opts.json && !opts.quiet {
                        emit(&format!(
                            "             line {:>4}  result of blocked call `{id}` not replayed: the host did not run it\n",
                            item.line
                        ));
                    }
                    continue;
                }
                let v = engine.observe(&Event::Result(ToolResult {
                    session,
                    call_id: id,
                    output,
                    is_error: *error,
                    exit_code: *exit_code,
                    time_ms,
                }));
                (v, tools_by_id.get(&(session, id.as_str())).copied())
            }
            Kind::Text {
                text,
                chunk,
                end,
                reasoning,
            } => (
                engine.observe(&Event::Text(Text {
                    session,
                    text,
                    chunk: *chunk,
                    end_of_turn: *end,
                    reasoning: *reasoning,
                    time_ms,
                })),
                Some("text"),
            ),
            Kind::User { text, injected } => (
                engine.observe(&Event::User(UserMessage {
                    session,
                    text,
                    injected: *injected,
                    time_ms,
                })),
                Some("user"),
            ),
            Kind::Reset => {
                state.calls.clear();
                state.blocked.clear();
                (engine.observe(&Event::Reset { session, time_ms }), None)
            }
        };
        if verdict.is_allow() {
            continue;
        }
        interventions += 1;
        let global = |seq: u64| -> Option<usize> {
            usize::try_from(seq)
                .ok()
                .and_then(|s| s.checked_sub(1))
                .and_then(|i| state.calls.get(i).copied())
        };
        let loop_start = verdict.loop_start.as_ref().and_then(|c| global(c.seq));
        let involved: Vec<usize> = verdict.calls.iter().filter_map(|c| global(c.seq)).collect();
        let latest_call = (call_index > 0).then_some(call_index);
        if opts.json {
            let record = json!({
                "file": file.display().to_string(),
                "session": session,
                "call": latest_call,
                "turn": item.turn,
                "event": event_no,
                "line": item.line,
                "kind": item.kind.name(),
                "tool": tool,
                "action": verdict.action.as_str(),
                "detector": verdict.detector.as_deref(),
                "rule": verdict.rule.as_deref(),
                "count": verdict.count,
                "message": verdict.message,
                "calls": involved,
                "loop_start": loop_start.map(|c| json!({"call": c})).unwrap_or(Value::Null),
            });
            emit(&format!("{record}\n"));
        } else {
            emit(&format!(
                "      {} {}  {} ×{}  {}  (event {event_no}, line {}{})\n",
                marker(verdict.action),
                verdict.action.as_str().to_uppercase(),
                verdict.detector.as_deref().unwrap_or("?"),
                verdict.count,
                verdict.rule.as_deref().unwrap_or(""),
                item.line,
                if matches!(item.kind, Kind::Call { .. }) {
                    String::new()
                } else {
                    format!(", on a {} event", item.kind.name())
                }
            ));
            emit(&format!("        {}\n", shorten(&verdict.message, 300)));
            if let Some(start) = loop_start {
                emit(&format!("        loop started at call {start}\n"));
            }
        }
        if verdict.action == Action::Terminate {
            state.terminated = true;
        }
    }
    if !opts.json {
        for (session, state) in &sessions {
            if state.terminated {
                emit(&format!(
                    "  session `{session}` terminated; its {} later event{} not replayed\n",
                    state.skipped,
                    if state.skipped == 1 { " was" } else { "s were" }
                ));
            }
        }
    }
    interventions
}

fn arguments_summary(item: &Item) -> String {
    match &item.kind {
        Kind::Call { arguments, .. } => arguments.summary(90),
        _ => String::new(),
    }
}

fn marker(action: Action) -> &'static str {
    match action {
        Action::Allow => " ",
        Action::Warn | Action::Ask => "!",
        Action::Block => "✋",
        Action::Terminate => "■",
    }
}
