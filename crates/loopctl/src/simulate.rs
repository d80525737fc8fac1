//! `loopctl simulate`: replay recorded conversations through a policy and show where and why it
//! would have intervened.
//!
//! Each transcript gets a fresh engine, so files never influence each other. The replay behaves
//! like a host that follows every verdict: the result of a blocked call is not replayed (the host
//! never ran the call), and a terminated session's later events are not replayed either.
//!
//! With `--group NAME` the transcripts are instead the workers of one swarm: one engine replays
//! them together, each file's sessions as workers of group `NAME` (the worker is named after the
//! file), their events merged by time (ties in file order, each file's own order kept), so that
//! the group detector sees the calls of every worker.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use loopguard_engine::LoadedPlugin;
use loopguard_engine::{
    Action, Arguments, Call, Engine, Event, Text, ToolResult, UserMessage, Verdict,
};
use loopguard_rules::{Policy, Settings, SourceMap};
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
    /// Replay the transcripts as the workers of one group (swarm) of this name.
    pub group: Option<String>,
}

/// How long a replay waits for a plugin's background work after each event.
const PLUGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The environment variable naming the policy file when `--rules` is not given.
pub const RULES_ENV: &str = "LOOPGUARD_RULES";

/// The server-level settings tier from `LOOPGUARD_ENABLED`, `LOOPGUARD_MAX_REPEATS`,
/// `LOOPGUARD_TTL_SECONDS` and `LOOPGUARD_MODE`; every bad value is reported.
pub(crate) fn server_settings(policy: &Policy) -> Result<Settings, u8> {
    let ladders: Vec<&str> = policy.base().ladders.keys().map(String::as_str).collect();
    Settings::from_env(|k| std::env::var(k).ok(), &ladders).map_err(|errors| {
        for e in errors {
            eprintln!("error: {e}");
        }
        EXIT_INVALID
    })
}

/// Loads the policy: the named file, else the built-in default. Prints diagnostics on failure.
fn load_policy(rules: Option<&Path>) -> Result<(Policy, SourceMap), u8> {
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
    match loaded.policy {
        Some(policy) => Ok((policy, loaded.sources)),
        None => {
            eprintln!(
                "error: the policy {} is invalid; run `loopctl validate` on it",
                rules.map_or("rules/default.yaml".into(), |p| p.display().to_string())
            );
            Err(EXIT_INVALID)
        }
    }
}

/// Loads fresh instances of the policy's enabled plugins (each transcript gets its own, so
/// transcripts never share plugin state). Prints every failure as a diagnostic.
fn load_plugins(policy: &Policy, sources: &SourceMap) -> Result<Vec<LoadedPlugin>, u8> {
    loopguard_engine::load_plugins(policy).map_err(|errors| {
        for e in &errors {
            eprintln!("{}", sources.render(&e.diagnostic()));
        }
        eprintln!(
            "error: {} plugin{} named by the policy could not be loaded; run `loopctl validate` on it",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" }
        );
        EXIT_INVALID
    })
}

pub fn run(files: &[PathBuf], opts: &Options) -> u8 {
    let rules = opts
        .rules
        .clone()
        .or_else(|| std::env::var_os(RULES_ENV).map(PathBuf::from));
    let (policy, sources) = match load_policy(rules.as_deref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let server = match server_settings(&policy) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let config = policy.resolve_with(opts.backend.as_deref(), opts.model.as_deref(), &server);
    let mut plugins = match load_plugins(&policy, &sources) {
        Ok(p) => Some(p),
        Err(code) => return code,
    };
    let plugin_names: Vec<String> = plugins
        .iter()
        .flatten()
        .map(|p| format!("`{}`", p.name()))
        .collect();
    let mut worst_input = EXIT_OK;
    let mut interventions = 0usize;
    if let Some(group) = &opts.group {
        let engine = Engine::with_plugins(config, plugins.take().unwrap_or_default());
        return run_group(files, group, &engine, &policy, &plugin_names, opts);
    }
    for file in files {
        let parsed = match read_transcript(file) {
            Ok(t) => t,
            Err(code) => {
                worst_input = worst_input.max(code);
                continue;
            }
        };
        if !opts.json {
            emit(&header(file, &parsed, &policy, &plugin_names, None));
        }
        let fresh = match plugins.take() {
            Some(p) => p,
            None => match load_plugins(&policy, &sources) {
                Ok(p) => p,
                Err(code) => return code,
            },
        };
        let engine = Engine::with_plugins(config.clone(), fresh);
        let worker = Worker {
            file,
            name: String::new(),
            items: &parsed.items,
        };
        interventions += replay(&[worker], None, &engine, opts);
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

/// One transcript of a replay; in a `--group` replay, one worker of the swarm.
struct Worker<'a> {
    file: &'a Path,
    /// The worker's name in a `--group` replay (empty otherwise).
    name: String,
    items: &'a [Item],
}

/// Reads and parses one transcript; prints what is wrong and returns the exit code otherwise.
fn read_transcript(file: &Path) -> Result<transcript::Transcript, u8> {
    let text = match std::fs::read(file) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "error: {}: not UTF-8 text (invalid byte at offset {})",
                    file.display(),
                    e.utf8_error().valid_up_to()
                );
                return Err(EXIT_INVALID);
            }
        },
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return Err(EXIT_CANNOT_RUN);
        }
    };
    transcript::parse(&text).map_err(|e| {
        let col = e.column.map(|c| format!(":{c}")).unwrap_or_default();
        eprintln!("error: {}:{}{col}: {}", file.display(), e.line, e.message);
        EXIT_INVALID
    })
}

/// The line that introduces a transcript in the timeline.
fn header(
    file: &Path,
    parsed: &transcript::Transcript,
    policy: &Policy,
    plugin_names: &[String],
    worker: Option<&str>,
) -> String {
    let calls = parsed
        .items
        .iter()
        .filter(|i| matches!(i.kind, Kind::Call { .. }))
        .count();
    format!(
        "{}  ({}, {} events, {} tool calls, policy `{}`{}{})\n",
        file.display(),
        parsed.format,
        parsed.items.len(),
        calls,
        policy.name,
        if plugin_names.is_empty() {
            String::new()
        } else {
            format!(", plugins {}", plugin_names.join(", "))
        },
        worker
            .map(|w| format!(", worker `{w}`"))
            .unwrap_or_default()
    )
}

/// `simulate --group`: every transcript is a worker of one swarm, replayed together through one
/// engine. A transcript that cannot be read stops the replay (the swarm would not be the same
/// without it).
fn run_group(
    files: &[PathBuf],
    group: &str,
    engine: &Engine,
    policy: &Policy,
    plugin_names: &[String],
    opts: &Options,
) -> u8 {
    let mut parsed = Vec::with_capacity(files.len());
    let mut worst_input = EXIT_OK;
    for file in files {
        match read_transcript(file) {
            Ok(t) => parsed.push(t),
            Err(code) => worst_input = worst_input.max(code),
        }
    }
    if worst_input != EXIT_OK {
        return worst_input;
    }
    let names = worker_names(files);
    if !opts.json {
        for ((file, t), name) in files.iter().zip(&parsed).zip(&names) {
            emit(&header(file, t, policy, plugin_names, Some(name)));
        }
        emit(&format!(
            "  {} workers of group `{group}`, events merged by time\n",
            files.len()
        ));
    }
    let workers: Vec<Worker<'_>> = files
        .iter()
        .zip(&parsed)
        .zip(names)
        .map(|((file, t), name)| Worker {
            file,
            name,
            items: &t.items,
        })
        .collect();
    let interventions = replay(&workers, Some(group), engine, opts);
    if !opts.json {
        emit(&format!(
            "{interventions} intervention{} in {} transcript{} (group `{group}`)\n",
            if interventions == 1 { "" } else { "s" },
            files.len(),
            if files.len() == 1 { "" } else { "s" },
        ));
    }
    if interventions > 0 {
        EXIT_INTERVENED
    } else {
        EXIT_OK
    }
}

/// Workers are named after their files (the file stem; the whole path when two stems are equal).
fn worker_names(files: &[PathBuf]) -> Vec<String> {
    let stem = |f: &PathBuf| {
        f.file_stem().map_or_else(
            || f.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    };
    files
        .iter()
        .map(|f| {
            let name = stem(f);
            if files.iter().filter(|g| stem(g) == name).count() > 1 {
                f.display().to_string()
            } else {
                name
            }
        })
        .collect()
}

/// The order in which the workers' events are replayed: by time, ties in worker order, each
/// worker's own order kept (a worker whose clock goes backwards is not reordered). One worker's
/// events are replayed as they are.
fn merged(workers: &[Worker<'_>]) -> Vec<(usize, usize)> {
    let mut next = vec![0usize; workers.len()];
    let mut order = Vec::with_capacity(workers.iter().map(|w| w.items.len()).sum());
    while let Some((_, w)) = workers
        .iter()
        .zip(&next)
        .enumerate()
        .filter_map(|(w, (worker, &k))| worker.items.get(k).map(|item| (item.time_ms, w)))
        .min()
    {
        if let Some(k) = next.get_mut(w) {
            order.push((w, *k));
            *k += 1;
        }
    }
    order
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

/// Replays transcripts through one engine: one transcript, or with `group` the workers of a
/// swarm (each worker's sessions join the group). Returns how many interventions it produced.
fn replay(workers: &[Worker<'_>], group: Option<&str>, engine: &Engine, opts: &Options) -> usize {
    let mut sessions: HashMap<(usize, &str), SessionState> = HashMap::new();
    let mut tools_by_id: HashMap<(usize, &str, &str), &str> = HashMap::new();
    // Per transcript: call numbers count the calls of their own file.
    let mut call_counts = vec![0usize; workers.len()];
    let mut interventions = 0usize;
    let background = engine.has_background_plugins();
    let width = workers.iter().map(|w| w.name.len()).max().unwrap_or(0);
    for (w, k) in merged(workers) {
        let (Some(worker), Some(item), Some(call_index)) = (
            workers.get(w),
            workers.get(w).and_then(|x| x.items.get(k)),
            call_counts.get_mut(w),
        ) else {
            continue;
        };
        let file = worker.file;
        let event_no = k + 1;
        // Work a plugin started in the background (a model consulted about the previous event)
        // finishes before the next event, so a replay gives the same verdicts every time.
        if background {
            engine.wait_plugins_idle(PLUGIN_WAIT);
        }
        // In a group replay each worker's sessions are its own: the engine sees them as
        // `worker/session`.
        let engine_session = match group {
            Some(_) => format!("{}/{}", worker.name, item.session),
            None => String::new(),
        };
        let session = match group {
            Some(_) => engine_session.as_str(),
            None => item.session.as_str(),
        };
        let state = sessions
            .entry((w, item.session.as_str()))
            .or_insert_with(|| {
                if let Some(g) = group {
                    engine.join_group(session, g, &worker.name);
                }
                SessionState::default()
            });
        if state.terminated {
            state.skipped += 1;
            continue;
        }
        // Who did it, in a group replay's timeline.
        let who = match group {
            Some(_) => format!("{:<width$}  ", worker.name),
            None => String::new(),
        };
        let whose = match group {
            Some(_) => format!("{}, ", worker.name),
            None => String::new(),
        };
        let time_ms = item.time_ms;
        let (verdict, tool): (Verdict, Option<&str>) = match &item.kind {
            Kind::Call {
                id,
                tool,
                arguments,
            } => {
                *call_index += 1;
                state.calls.push(*call_index);
                tools_by_id.insert((w, item.session.as_str(), id.as_str()), tool.as_str());
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
                        "  {who}call {:>3}  turn {:>3}  line {:>4}  {tool} {}\n",
                        *call_index,
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
                            "  {who}           line {:>4}  result of blocked call `{id}` not replayed: the host did not run it\n",
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
                (
                    v,
                    tools_by_id
                        .get(&(w, item.session.as_str(), id.as_str()))
                        .copied(),
                )
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
        let in_group = |mut record: Value| {
            if let (Some(g), Value::Object(fields)) = (group, &mut record) {
                fields.insert("group".to_owned(), json!(g));
                fields.insert("worker".to_owned(), json!(worker.name));
            }
            record
        };
        for note in &verdict.notes {
            if opts.json {
                let record = in_group(json!({
                    "file": file.display().to_string(),
                    "session": item.session,
                    "event": event_no,
                    "line": item.line,
                    "kind": item.kind.name(),
                    "note": note.code,
                    "plugin": note.plugin,
                    "message": note.message,
                }));
                emit(&format!("{record}\n"));
            } else {
                emit(&format!(
                    "      ⚠ {}: {}  ({whose}event {event_no}, line {})\n",
                    note.code, note.message, item.line
                ));
            }
        }
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
        let latest_call = (*call_index > 0).then_some(*call_index);
        if opts.json {
            let record = in_group(json!({
                "file": file.display().to_string(),
                "session": item.session,
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
            }));
            emit(&format!("{record}\n"));
        } else {
            emit(&format!(
                "      {} {}  {} ×{}  {}  ({whose}event {event_no}, line {}{})\n",
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
        for ((w, session), state) in &sessions {
            if state.terminated {
                let whose = match (group, workers.get(*w)) {
                    (Some(_), Some(worker)) => format!("worker `{}`: ", worker.name),
                    _ => String::new(),
                };
                emit(&format!(
                    "  {whose}session `{session}` terminated; its {} later event{} not replayed\n",
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
