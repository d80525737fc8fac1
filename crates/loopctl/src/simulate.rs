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
//!
//! The replay itself ([`replay`]) is shared with `loopctl test`: it returns the list of
//! [`Intervention`]s and reports the rest of the timeline to a caller-supplied sink, so both
//! commands judge exactly the same verdicts.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use loopguard_engine::LoadedPlugin;
use loopguard_engine::{
    Action, Arguments, Call, Engine, Event, Note, Text, ToolResult, UserMessage,
};
use loopguard_rules::{Policy, Settings};
use serde_json::{Value, json};

use crate::policy::{self, Failure};
use crate::transcript::{self, Args, Item, Kind, Line, shorten};
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

/// Everything a replay needs before the first transcript: the policy (`--rules`, else
/// `LOOPGUARD_RULES`, else the built-in default), the `LOOPGUARD_*` server tier, the overrides
/// for the backend and model, and the policy's plugins (loaded once up front, so a plugin that
/// does not load fails the command before any transcript is read).
pub(crate) struct Setup {
    pub policy: Policy,
    loaded: crate::policy::Loaded,
    backend: Option<String>,
    model: Option<String>,
    server: Settings,
    /// The plugins loaded up front, for the first engine; later engines load fresh instances.
    spare: Option<Vec<LoadedPlugin>>,
    /// The plugins' names in backticks, for headers.
    pub plugin_names: Vec<String>,
}

impl Setup {
    /// Loads the policy and its plugins; prints what is wrong and returns the exit code otherwise.
    pub fn load(
        rules: Option<&Path>,
        backend: Option<&str>,
        model: Option<&str>,
    ) -> Result<Setup, u8> {
        let loaded = policy::load(policy::rules_path(rules).as_deref()).map_err(Failure::report)?;
        let server = loaded.server_settings().map_err(Failure::report)?;
        let plugins = loaded.plugins().map_err(Failure::report)?;
        let policy = loaded.policy.clone();
        let plugin_names = plugins.iter().map(|p| format!("`{}`", p.name())).collect();
        Ok(Setup {
            policy,
            loaded,
            backend: backend.map(str::to_owned),
            model: model.map(str::to_owned),
            server,
            spare: Some(plugins),
            plugin_names,
        })
    }

    /// A fresh engine with its own plugin instances.
    pub fn engine(&mut self) -> Result<Engine, u8> {
        let plugins = match self.spare.take() {
            Some(p) => p,
            None => self.loaded.plugins().map_err(Failure::report)?,
        };
        let mut b = Engine::builder(&self.policy)
            .server_settings(self.server.clone())
            .plugins(plugins);
        if let Some(backend) = &self.backend {
            b = b.backend(backend);
        }
        if let Some(model) = &self.model {
            b = b.model(model);
        }
        b.build().map_err(|e| {
            eprintln!("error: {e}");
            EXIT_CANNOT_RUN
        })
    }
}

pub fn run(files: &[PathBuf], opts: &Options) -> u8 {
    let mut setup = match Setup::load(
        opts.rules.as_deref(),
        opts.backend.as_deref(),
        opts.model.as_deref(),
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(group) = &opts.group {
        return run_group(files, group, &mut setup, opts);
    }
    let mut worst_input = EXIT_OK;
    let mut interventions = 0usize;
    for file in files {
        let parsed = match read_transcript(file) {
            Ok(t) => t,
            Err(code) => {
                worst_input = worst_input.max(code);
                continue;
            }
        };
        if !opts.json {
            emit(&header(
                file,
                &parsed,
                &setup.policy,
                &setup.plugin_names,
                None,
            ));
        }
        let engine = match setup.engine() {
            Ok(e) => e,
            Err(code) => return code,
        };
        let workers = [Worker {
            file,
            name: String::new(),
            items: &parsed.items,
        }];
        let printer = Printer {
            workers: &workers,
            group: None,
            opts,
        };
        interventions += replay(&workers, None, &engine, &mut |step| printer.print(&step)).len();
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
pub(crate) struct Worker<'a> {
    pub file: &'a Path,
    /// The worker's name in a `--group` replay (empty otherwise).
    pub name: String,
    pub items: &'a [Item],
}

/// A file that could not be read as a transcript: the exit code it calls for and a one-line
/// message that starts with the file name (and line and column, when known).
#[derive(Debug)]
pub(crate) struct InputError {
    pub code: u8,
    pub message: String,
}

/// Largest transcript (or case file) accepted: recorded conversations are far larger than
/// policies, but a file is still read whole into memory.
pub const MAX_TRANSCRIPT_BYTES: usize = 64 << 20;

/// Reads a transcript (or a case's sidecar) as UTF-8 text: a regular file of at most
/// [`MAX_TRANSCRIPT_BYTES`]. Text that is not UTF-8 is invalid input; anything else that stops
/// the read (a missing file, a device or FIFO, a file over the limit) means it cannot run.
pub(crate) fn read_text(file: &Path) -> Result<String, InputError> {
    loopguard_rules::read::read_text(file, MAX_TRANSCRIPT_BYTES, "transcripts").map_err(|e| {
        InputError {
            code: if e.kind() == std::io::ErrorKind::InvalidData {
                EXIT_INVALID
            } else {
                EXIT_CANNOT_RUN
            },
            message: format!("{}: {e}", file.display()),
        }
    })
}

/// Parses the text of `file` as a transcript of any supported format.
pub(crate) fn parse_transcript(
    file: &Path,
    text: &str,
) -> Result<transcript::Transcript, InputError> {
    transcript::parse(text).map_err(|e| {
        let col = e.column.map(|c| format!(":{c}")).unwrap_or_default();
        InputError {
            code: EXIT_INVALID,
            message: format!("{}:{}{col}: {}", file.display(), e.line, e.message),
        }
    })
}

/// Reads and parses one transcript; prints what is wrong and returns the exit code otherwise.
fn read_transcript(file: &Path) -> Result<transcript::Transcript, u8> {
    read_text(file)
        .and_then(|text| parse_transcript(file, &text))
        .map_err(|e| {
            eprintln!("error: {}", e.message);
            e.code
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
fn run_group(files: &[PathBuf], group: &str, setup: &mut Setup, opts: &Options) -> u8 {
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
    let engine = match setup.engine() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let names = worker_names(files);
    if !opts.json {
        for ((file, t), name) in files.iter().zip(&parsed).zip(&names) {
            emit(&header(
                file,
                t,
                &setup.policy,
                &setup.plugin_names,
                Some(name),
            ));
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
    let printer = Printer {
        workers: &workers,
        group: Some(group),
        opts,
    };
    let interventions = replay(&workers, Some(group), &engine, &mut |step| {
        printer.print(&step);
    })
    .len();
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

/// The engine event for one transcript event: the one place where transcript kinds become
/// engine events.
fn engine_event<'a>(kind: &'a Kind, session: &'a str, time_ms: u64) -> Event<'a> {
    match kind {
        Kind::Call {
            id,
            tool,
            arguments,
        } => Event::Call(Call {
            session,
            call_id: id,
            tool,
            arguments: match arguments {
                Args::Json(v) => Arguments::Json(v),
                Args::Raw(s) => Arguments::Raw(s),
            },
            time_ms,
        }),
        Kind::Result {
            id,
            output,
            error,
            exit_code,
        } => Event::Result(ToolResult {
            session,
            call_id: id,
            output,
            is_error: *error,
            exit_code: *exit_code,
            time_ms,
        }),
        Kind::Text {
            text,
            chunk,
            end,
            reasoning,
            narration,
        } => Event::Text(Text {
            session,
            text,
            chunk: *chunk,
            end_of_turn: *end,
            reasoning: *reasoning,
            narration: *narration,
            time_ms,
        }),
        Kind::User { text, injected } => Event::User(UserMessage {
            session,
            text,
            injected: *injected,
            time_ms,
        }),
        Kind::Reset => Event::Reset { session, time_ms },
    }
}

/// One intervention of a replay: a verdict other than `allow`, placed in its transcript.
#[derive(Clone, Debug)]
pub(crate) struct Intervention {
    /// Index of the worker (transcript) in the replay.
    pub worker: usize,
    /// The session as the transcript names it.
    pub session: String,
    /// 1-based index of the latest tool call of the transcript so far (`None` before any call).
    pub call: Option<usize>,
    /// 1-based assistant message of the event.
    pub turn: u64,
    /// 1-based event of the transcript.
    pub event: usize,
    pub line: Line,
    /// `call`, `result`, `text`, `user` or `reset`.
    pub kind: &'static str,
    /// The tool of the call (or of the call a result answers); `text`/`user` for those events.
    pub tool: Option<String>,
    pub action: Action,
    pub detector: Option<String>,
    pub rule: Option<String>,
    pub count: u32,
    pub message: String,
    /// The calls that make up the loop, as transcript call indexes.
    pub calls: Vec<usize>,
    /// The call where the loop started, as a transcript call index.
    pub loop_start: Option<usize>,
}

impl Intervention {
    /// The intervention as one `simulate --json` record.
    pub fn record(&self, file: &Path) -> Value {
        json!({
            "file": file.display().to_string(),
            "session": self.session,
            "call": self.call,
            "turn": self.turn,
            "event": self.event,
            "line": self.line,
            "kind": self.kind,
            "tool": self.tool,
            "action": self.action.as_str(),
            "detector": self.detector,
            "rule": self.rule,
            "count": self.count,
            "message": self.message,
            "calls": self.calls,
            "loop_start": self.loop_start.map(|c| json!({"call": c})).unwrap_or(Value::Null),
        })
    }
}

/// What a replay reports to its sink as it goes, beside the interventions it returns.
pub(crate) enum Step<'r> {
    /// A tool call was replayed; `call` is its index in its transcript.
    Call {
        worker: usize,
        call: usize,
        item: &'r Item,
    },
    /// The result of a blocked call was not replayed.
    BlockedResult {
        worker: usize,
        item: &'r Item,
        id: &'r str,
    },
    /// A plugin note attached to a verdict.
    Note {
        worker: usize,
        item: &'r Item,
        event: usize,
        note: &'r Note,
    },
    Intervention(&'r Intervention),
    /// After the replay: a session that was terminated, and how many of its events were skipped.
    Terminated {
        worker: usize,
        session: &'r str,
        skipped: usize,
    },
}

/// Per-session bookkeeping of the replay.
#[derive(Default)]
struct SessionState<'a> {
    /// Transcript-wide call index of each call the engine has seen in this session since it
    /// started or was reset, by the engine's 1-based sequence number.
    calls: Vec<usize>,
    /// The calls not answered yet, by call id (the empty id for calls without one), oldest
    /// first: a result answers the oldest unanswered call with its id, so results find their
    /// calls by position when ids are missing or reused.
    pending: HashMap<&'a str, VecDeque<Pending<'a>>>,
    terminated: bool,
    skipped: usize,
}

/// A call waiting for its result.
struct Pending<'a> {
    tool: &'a str,
    /// The call was blocked: the host never ran it, so its result is not replayed.
    blocked: bool,
}

/// Replays transcripts through one engine like a host that obeys every verdict: one transcript,
/// or with `group` the workers of a swarm (each worker's sessions join the group). Returns the
/// interventions in order; everything else of the timeline goes to `sink`.
pub(crate) fn replay(
    workers: &[Worker<'_>],
    group: Option<&str>,
    engine: &Engine,
    sink: &mut dyn FnMut(Step<'_>),
) -> Vec<Intervention> {
    // Sessions in the order they first appear, and where each is in that list.
    let mut sessions: Vec<((usize, &str), SessionState<'_>)> = Vec::new();
    let mut session_index: HashMap<(usize, &str), usize> = HashMap::new();
    // Per transcript: call numbers count the calls of their own file.
    let mut call_counts = vec![0usize; workers.len()];
    let mut interventions = Vec::new();
    let background = engine.has_background_plugins();
    for (w, k) in merged(workers) {
        let (Some(worker), Some(item), Some(call_index)) = (
            workers.get(w),
            workers.get(w).and_then(|x| x.items.get(k)),
            call_counts.get_mut(w),
        ) else {
            continue;
        };
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
        let key = (w, item.session.as_str());
        let index = *session_index.entry(key).or_insert_with(|| {
            if let Some(g) = group {
                engine.join_group(session, g, &worker.name);
            }
            sessions.push((key, SessionState::default()));
            sessions.len() - 1
        });
        let Some((_, state)) = sessions.get_mut(index) else {
            continue;
        };
        if state.terminated {
            state.skipped += 1;
            continue;
        }
        let tool: Option<&str> = match &item.kind {
            Kind::Call { id, tool, .. } => {
                *call_index += 1;
                state.calls.push(*call_index);
                state
                    .pending
                    .entry(id.as_str())
                    .or_default()
                    .push_back(Pending {
                        tool: tool.as_str(),
                        blocked: false,
                    });
                sink(Step::Call {
                    worker: w,
                    call: *call_index,
                    item,
                });
                Some(tool.as_str())
            }
            Kind::Result { id, .. } => {
                let answered = state
                    .pending
                    .get_mut(id.as_str())
                    .and_then(VecDeque::pop_front);
                if answered.as_ref().is_some_and(|p| p.blocked) {
                    sink(Step::BlockedResult {
                        worker: w,
                        item,
                        id,
                    });
                    continue;
                }
                answered.map(|p| p.tool)
            }
            Kind::Text { .. } => Some("text"),
            Kind::User { .. } => Some("user"),
            Kind::Reset => {
                state.calls.clear();
                state.pending.clear();
                None
            }
        };
        let verdict = engine.observe(&engine_event(&item.kind, session, item.time_ms));
        if let Kind::Call { id, .. } = &item.kind
            && verdict.action >= Action::Block
            && let Some(call) = state
                .pending
                .get_mut(id.as_str())
                .and_then(VecDeque::back_mut)
        {
            call.blocked = true;
        }
        for note in &verdict.notes {
            sink(Step::Note {
                worker: w,
                item,
                event: event_no,
                note,
            });
        }
        if verdict.is_allow() {
            continue;
        }
        let global = |seq: u64| -> Option<usize> {
            usize::try_from(seq)
                .ok()
                .and_then(|s| s.checked_sub(1))
                .and_then(|i| state.calls.get(i).copied())
        };
        let intervention = Intervention {
            worker: w,
            session: item.session.clone(),
            call: (*call_index > 0).then_some(*call_index),
            turn: item.turn,
            event: event_no,
            line: item.line,
            kind: item.kind.name(),
            tool: tool.map(str::to_owned),
            action: verdict.action,
            detector: verdict.detector.as_deref().map(str::to_owned),
            rule: verdict.rule.clone(),
            count: verdict.count,
            calls: verdict.calls.iter().filter_map(|c| global(c.seq)).collect(),
            loop_start: verdict.loop_start.as_ref().and_then(|c| global(c.seq)),
            message: verdict.message,
        };
        if intervention.action == Action::Terminate {
            state.terminated = true;
        }
        sink(Step::Intervention(&intervention));
        interventions.push(intervention);
    }
    for ((w, session), state) in &sessions {
        if state.terminated {
            sink(Step::Terminated {
                worker: *w,
                session,
                skipped: state.skipped,
            });
        }
    }
    interventions
}

/// Prints a replay's timeline as `simulate` shows it: human-readable, or JSON Lines.
struct Printer<'p, 'a> {
    workers: &'p [Worker<'a>],
    group: Option<&'p str>,
    opts: &'p Options,
}

impl Printer<'_, '_> {
    fn print(&self, step: &Step<'_>) {
        let opts = self.opts;
        let worker = |w: usize| self.workers.get(w);
        let name = |w: usize| worker(w).map_or("", |x| x.name.as_str());
        let file = |w: usize| {
            worker(w)
                .map(|x| x.file.display().to_string())
                .unwrap_or_default()
        };
        // Who did it, in a group replay's timeline.
        let width = self.workers.iter().map(|w| w.name.len()).max().unwrap_or(0);
        let who = |w: usize| match self.group {
            Some(_) => format!("{:<width$}  ", name(w)),
            None => String::new(),
        };
        let whose = |w: usize| match self.group {
            Some(_) => format!("{}, ", name(w)),
            None => String::new(),
        };
        let in_group = |w: usize, mut record: Value| {
            if let (Some(g), Value::Object(fields)) = (self.group, &mut record) {
                fields.insert("group".to_owned(), json!(g));
                fields.insert("worker".to_owned(), json!(name(w)));
            }
            record
        };
        match step {
            Step::Call { worker, call, item } => {
                if !opts.json && !opts.quiet {
                    emit(&format!(
                        "  {}call {:>3}  turn {:>3}  line {:>4}  {} {}\n",
                        who(*worker),
                        call,
                        item.turn,
                        item.line,
                        match &item.kind {
                            Kind::Call { tool, .. } => tool.as_str(),
                            _ => "",
                        },
                        arguments_summary(item)
                    ));
                }
            }
            Step::BlockedResult { worker, item, id } => {
                if !opts.json && !opts.quiet {
                    emit(&format!(
                        "  {}           line {:>4}  result of blocked call `{id}` not replayed: the host did not run it\n",
                        who(*worker),
                        item.line
                    ));
                }
            }
            Step::Note {
                worker,
                item,
                event,
                note,
            } => {
                if opts.json {
                    let record = in_group(
                        *worker,
                        json!({
                            "file": file(*worker),
                            "session": item.session,
                            "event": event,
                            "line": item.line,
                            "kind": item.kind.name(),
                            "note": note.code,
                            "plugin": note.plugin,
                            "message": note.message,
                        }),
                    );
                    emit(&format!("{record}\n"));
                } else {
                    emit(&format!(
                        "      ⚠ {}: {}  ({}event {event}, line {})\n",
                        note.code,
                        note.message,
                        whose(*worker),
                        item.line
                    ));
                }
            }
            Step::Intervention(i) => {
                if opts.json {
                    let record = in_group(
                        i.worker,
                        i.record(worker(i.worker).map_or(Path::new(""), |x| x.file)),
                    );
                    emit(&format!("{record}\n"));
                } else {
                    emit(&format!(
                        "      {} {}  {} ×{}  {}  ({}event {}, line {}{})\n",
                        marker(i.action),
                        i.action.as_str().to_uppercase(),
                        i.detector.as_deref().unwrap_or("?"),
                        i.count,
                        i.rule.as_deref().unwrap_or(""),
                        whose(i.worker),
                        i.event,
                        i.line,
                        if i.kind == "call" {
                            String::new()
                        } else {
                            format!(", on a {} event", i.kind)
                        }
                    ));
                    emit(&format!("        {}\n", shorten(&i.message, 300)));
                    if let Some(start) = i.loop_start {
                        emit(&format!("        loop started at call {start}\n"));
                    }
                }
            }
            Step::Terminated {
                worker,
                session,
                skipped,
            } => {
                if !opts.json {
                    let whose = match self.group {
                        Some(_) => format!("worker `{}`: ", name(*worker)),
                        None => String::new(),
                    };
                    emit(&format!(
                        "  {whose}session `{session}` terminated; its {skipped} later event{} not replayed\n",
                        if *skipped == 1 { " was" } else { "s were" }
                    ));
                }
            }
        }
    }
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
