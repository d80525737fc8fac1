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
//! The replay itself (`loopguard_transcript::replay`) is shared with `loopctl test` and the
//! Python package: it returns the list of interventions and reports the rest of the timeline to
//! a caller-supplied sink, so all of them judge exactly the same verdicts.

use std::path::{Path, PathBuf};

use loopguard_engine::LoadedPlugin;
use loopguard_engine::{Action, Engine};
use loopguard_rules::{Policy, Settings};
use serde_json::{Value, json};

use crate::policy::{self, Failure};
use crate::transcript::replay::{Step, Worker, replay};
use crate::transcript::{self, Item, Kind, shorten};
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
