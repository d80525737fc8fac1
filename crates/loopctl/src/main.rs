//! `loopctl`: check loopguard policies, print their schema, replay transcripts through them and
//! test policies against labelled transcripts.
//!
//! Each subcommand lives in its own module (`validate`, `simulate`, `cases` for `test`,
//! `plugins`, `proxy`); `policy` is the one way a command loads a policy to run. The libraries
//! do the work: `loopguard-rules` loads and checks, `loopguard-transcript` replays,
//! `loopguard-engine` judges; this crate parses arguments and prints.
//!
//! ```sh
//! loopctl validate rules/                     # every problem, as file:line:col
//! loopctl simulate examples/looping-openai.json   # exit status 3: the policy intervened
//! loopctl schema --reference > reference.md   # the rule reference, from the declarations
//! ```

#![warn(missing_docs)]

mod cases;
mod plugins;
mod policy;
mod proxy;
mod simulate;
mod validate;

/// The transcript reader, shared with the tests and hosts.
pub(crate) use loopguard_transcript as transcript;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// The allocator of the binary (see the workspace's `Cargo.toml` for why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code: everything checked is valid / nothing to report.
pub const EXIT_OK: u8 = 0;
/// Exit code: the input is invalid (a policy with errors, a malformed transcript).
pub const EXIT_INVALID: u8 = 1;
/// Exit code: the command could not run (missing file, unreadable input).
pub const EXIT_CANNOT_RUN: u8 = 2;
/// Exit code of `simulate`: the policy intervened at least once. Of `test`: a case failed, or a
/// gate was not met.
pub const EXIT_INTERVENED: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "loopctl",
    version,
    about = "loopguard: catch tool-call loops of LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How `validate` prints what it found (`--error-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ErrorFormat {
    /// Rendered snippets on stderr: `file:line:col`, the source underlined, the help.
    Human,
    /// One JSON report on stdout.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check policy files (or every .yaml/.yml file in directories) and report every problem.
    ///
    /// By default the plugins a valid policy names are loaded too: a missing library, one built
    /// for another plugin ABI, or a `config` its schema refuses is an error. Loading a plugin runs
    /// its code (the library's initializers and the plugin's `create`): use --no-plugins to
    /// validate an untrusted policy. Exit status: 0 when valid, 1 when invalid, 2 when a file
    /// could not be read.
    Validate {
        /// Policy files or directories.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// How to print diagnostics.
        #[arg(long, value_enum, default_value = "human")]
        error_format: ErrorFormat,
        /// Treat warnings as errors.
        #[arg(long)]
        deny_warnings: bool,
        /// Also say how a valid policy treats this tool: its category and why (a `tools` entry
        /// or a category's pattern), whether it is watched, and the detectors it is exempt
        /// from. Repeatable.
        #[arg(long = "tool", value_name = "NAME")]
        tools: Vec<String>,
        /// Do not load the plugins the policy names (loading a plugin runs its code): their
        /// paths, ABI and `config` are then not checked. Use it to validate an untrusted policy.
        #[arg(long)]
        no_plugins: bool,
    },
    /// Print the JSON Schema of the policy format (for editors such as yaml-language-server).
    Schema {
        /// Print the Markdown rule reference instead.
        #[arg(long, conflicts_with_all = ["events", "test_case"])]
        reference: bool,
        /// Print the JSON Schema of one line of the loopguard event format instead.
        #[arg(long, conflicts_with = "test_case")]
        events: bool,
        /// Print the JSON Schema of a `loopctl test` case file (and of a sidecar
        /// NAME.expect.json) instead.
        #[arg(long)]
        test_case: bool,
    },
    /// Describe detector plugins: name, version, plugin ABI version, thread-safety and the JSON
    /// Schema of their configuration.
    ///
    /// Each library is loaded (never unloaded) and its ABI version checked, but no instance is
    /// created. Exit status: 0 when every file is a loadable plugin, 2 when one is not.
    Plugins {
        /// Plugin shared libraries (`.so`, `.dylib`, `.dll`).
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// Print one JSON object per plugin, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Run a proxy that stops tool-call loops: point an agent's base URL at it and it forwards
    /// OpenAI chat completions, Anthropic Messages and OpenAI Responses to `--upstream`,
    /// warning, refusing or stopping looping tool calls as the policy says.
    ///
    /// Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when the policy or the
    /// LOOPGUARD_* settings are invalid, 2 when it cannot start (unreadable policy, address in
    /// use, bad upstream URL).
    Proxy(proxy::Args),
    /// Replay recorded conversations through a policy and show where and why it intervenes.
    ///
    /// Transcripts are loopguard event JSON Lines, OpenAI chat-completions messages (an array,
    /// JSON Lines, or a request body with `messages`), Anthropic messages, OpenAI Responses
    /// items (an array, JSON Lines, a request body with `input`, a response with `output`, or
    /// a Codex rollout), Gemini contents (an array, JSON Lines, or a body with `contents`), a
    /// Gemini CLI session file or a Claude Code session (JSON Lines), detected from the
    /// content. The policy's plugins are loaded and run beside the built-in detectors (their
    /// detections show under the plugin's name). Transcripts are read whole, up to 64 MiB each
    /// (policies: 1 MiB); only regular files are read. Exit status: 0 when the policy never
    /// intervened, 3 when it did, 1 on bad input (a malformed transcript or policy, a plugin that
    /// does not load), 2 when a file could not be read.
    Simulate {
        /// Transcript files.
        #[arg(required = true)]
        transcripts: Vec<std::path::PathBuf>,
        /// The policy file; default: the built-in `rules/default.yaml`.
        #[arg(long, value_name = "FILE")]
        rules: Option<std::path::PathBuf>,
        /// Apply the policy's overrides for this backend.
        #[arg(long)]
        backend: Option<String>,
        /// Apply the policy's overrides for this model.
        #[arg(long)]
        model: Option<String>,
        /// Print one JSON object per intervention (and one per plugin note, with a `note` key),
        /// one per line, and nothing else.
        #[arg(long)]
        json: bool,
        /// Print only the interventions, not every tool call.
        #[arg(long, short)]
        quiet: bool,
        /// Replay the transcripts together as the workers of one swarm named NAME (each file a
        /// worker named after it, events merged by time), so that loops of the whole swarm show
        /// (detector `group_loop`); `--json` records gain `group` and `worker`.
        #[arg(long, value_name = "NAME")]
        group: Option<String>,
    },
    /// Run labelled transcripts as regression tests of a policy: each case says whether it is a
    /// loop and where the policy must first intervene.
    ///
    /// A case is a transcript in any format `simulate` reads plus an `expect` block
    /// (`{"loop": true, "unit": "call", "earliest": 3, "latest": 4}`): beside `messages` (or a
    /// body's `input` or `contents`) in the same JSON object, or in a sidecar NAME.expect.json
    /// next to NAME.json / NAME.jsonl (the schema: `loopctl schema --test-case`). Each case is replayed exactly as `simulate` replays
    /// it, and its first intervention judged: PASS, EARLY, LATE, MISSED, FALSE ALARM, HARD FALSE
    /// ALARM (a block or terminate on a non-loop case).
    ///
    /// Exit status: 0 when every case passed, or, when a gate is given, when every gate is met;
    /// 3 when not; 1 on bad input (a malformed case, expect block or policy, a transcript with
    /// no expect block); 2 when a path could not be read. Every case is run even when another
    /// is bad.
    Test {
        /// Case files, or directories (every *.json / *.jsonl file in them, not recursing;
        /// *.expect.json files are sidecars, not cases).
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// The policy file; default: LOOPGUARD_RULES, else the built-in `rules/default.yaml`.
        #[arg(long, value_name = "FILE")]
        rules: Option<std::path::PathBuf>,
        /// Apply the policy's overrides for this backend.
        #[arg(long)]
        backend: Option<String>,
        /// Apply the policy's overrides for this model.
        #[arg(long)]
        model: Option<String>,
        /// Print one JSON object per case, then one with the totals (key `totals`).
        #[arg(long)]
        json: bool,
        /// Gate: at least this share of loop cases caught in range, as a fraction (0.9) or a
        /// percentage (90%).
        #[arg(long, value_name = "R", value_parser = cases::parse_recall)]
        min_recall: Option<f64>,
        /// Gate: at most N non-loop cases with an intervention (hard ones included).
        #[arg(long, value_name = "N")]
        max_false_alarms: Option<usize>,
        /// Gate: at most N non-loop cases with a block or terminate; 0 when only other gates
        /// are given.
        #[arg(long, value_name = "N")]
        max_hard_false_alarms: Option<usize>,
        /// Leave out the cases carrying this tag (repeatable).
        #[arg(long = "exclude-tag", value_name = "TAG")]
        exclude_tags: Vec<String>,
    },
}

/// Writes to standard output; a closed pipe (`loopctl … | head`) is not an error.
pub fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Validate {
            paths,
            error_format,
            deny_warnings,
            tools,
            no_plugins,
        } => validate::run(
            &paths,
            error_format,
            deny_warnings,
            &tools,
            validate::Plugins::from_flag(no_plugins),
        ),
        Command::Simulate {
            transcripts,
            rules,
            backend,
            model,
            json,
            quiet,
            group,
        } => simulate::run(
            &transcripts,
            &simulate::Options {
                rules,
                backend,
                model,
                json,
                quiet,
                group,
            },
        ),
        Command::Test {
            paths,
            rules,
            backend,
            model,
            json,
            min_recall,
            max_false_alarms,
            max_hard_false_alarms,
            exclude_tags,
        } => cases::run(
            &paths,
            &cases::Options {
                rules,
                backend,
                model,
                json,
                min_recall,
                max_false_alarms,
                max_hard_false_alarms,
                exclude_tags,
            },
        ),
        Command::Plugins { paths, json } => plugins::run(&paths, json),
        Command::Proxy(args) => proxy::run(args),
        Command::Schema {
            reference,
            events,
            test_case,
        } => {
            if test_case {
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&cases::case_schema()).unwrap_or_default()
                ));
            } else if events {
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&transcript::event_schema()).unwrap_or_default()
                ));
            } else if reference {
                emit(&loopguard_rules::generate::reference_markdown());
            } else {
                let schema = loopguard_rules::generate::json_schema();
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&schema).unwrap_or_default()
                ));
            }
            EXIT_OK
        }
    };
    ExitCode::from(code)
}
